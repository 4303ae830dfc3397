"""Settings: App argument over ``hearth serve`` option over ``HEARTH_*`` over the default; bad
values and malformed database URLs are configuration errors; messages never show a password."""

from __future__ import annotations

import pytest
import serverapp

import hearth
from hearth.config import Settings, shown_db
from hearth.errors import ConfigurationError
from hearth.store import open_store


def test_hearth_pg_pool_defaults_to_10_and_comes_from_the_environment() -> None:
    assert Settings.resolve(env={}).pg_pool == 10
    assert Settings.resolve(env={"HEARTH_PG_POOL": "4"}).pg_pool == 4


def test_an_app_argument_beats_the_serve_option_which_beats_hearth_pg_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HEARTH_PG_POOL", "4")
    app = hearth.App(serverapp.AGENTS, providers=serverapp.MODELS)
    app.configure(pg_pool=6)
    assert app.settings.pg_pool == 6
    pinned = hearth.App(serverapp.AGENTS, providers=serverapp.MODELS, pg_pool=2)
    pinned.configure(pg_pool=6)
    assert pinned.settings.pg_pool == 2


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_a_bad_hearth_pg_pool_is_a_configuration_error(value: str) -> None:
    with pytest.raises(ConfigurationError, match="pg_pool"):
        Settings.resolve(env={"HEARTH_PG_POOL": value})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HEARTH_SHUTDOWN_S", "inf"),  # a traceback from hearth serve
        ("HEARTH_SHUTDOWN_S", "nan"),
        ("HEARTH_LEASE_S", "nan"),  # taken silently: no comparison holds for NaN
        ("HEARTH_HEARTBEAT_S", "nan"),
        ("HEARTH_SCAN_S", "inf"),
        ("HEARTH_PORT", "70000"),  # a traceback from bind()
        ("HEARTH_PORT", "-1"),
        ("HEARTH_WORKERS", "100000000000000000000"),  # admitted, then no work ever ran
        ("HEARTH_MAX_STREAMS", "100000000000000000000"),
        ("HEARTH_TOKEN", "s\u00e9cret"),  # the SDK and the CLI could not send it
        ("HEARTH_TOKEN", " padded "),
    ],
)
def test_a_setting_that_would_break_the_server_later_is_refused_now(
    variable: str, value: str
) -> None:
    name = variable.removeprefix("HEARTH_").lower()
    with pytest.raises(ConfigurationError, match=name):
        Settings.resolve(env={variable: value})


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pw@db.internal:54x32/app",
        "postgres://u:pw@[::1/app",
        "postgresql://u:pw@db.internal:99999/app",
    ],
)
def test_a_malformed_postgres_url_is_a_configuration_error_without_the_password(
    url: str,
) -> None:
    with pytest.raises(ConfigurationError, match="malformed") as caught:
        Settings.resolve(env={"HEARTH_DB": url})
    assert "pw" not in str(caught.value)


def test_a_shown_database_url_masks_only_the_password() -> None:
    assert shown_db(None) == "./hearth.db"
    assert shown_db("sqlite:///x.db") == "sqlite:///x.db"
    assert shown_db("postgresql://app@db:5432/h?schema=s") == "postgresql://app@db:5432/h?schema=s"
    assert shown_db("postgresql://app:s3cret@db:5432/h?schema=s") == (
        "postgresql://app:***@db:5432/h?schema=s"
    )


def test_a_raw_at_sign_in_a_postgres_password_is_refused_without_any_of_the_password() -> None:
    """libpq ends the user information at the first @: the password's tail was taken for the
    host, and named as one in the connection error."""
    url = "postgresql://alice:S3cret@Tail-of-pw@127.0.0.1:1/db"
    for open_it in (lambda: Settings.resolve(env={"HEARTH_DB": url}), lambda: open_store(url)):
        with pytest.raises(ConfigurationError, match="%40") as caught:
            open_it()
        assert "S3cret" not in str(caught.value) and "Tail" not in str(caught.value)
    assert shown_db("postgresql://alice:S3cret@Tail@[::1/db") == "postgresql://alice:***@[::1/db"


def test_the_settings_repr_masks_the_token_and_the_database_password() -> None:
    db = "postgresql://app:s3cret-pw@db:5432/h?schema=s"
    shown = repr(Settings.resolve(env={}, token="tok-9f1e", db=db, port=8123))
    assert "tok-9f1e" not in shown and "s3cret-pw" not in shown
    assert "token='***'" in shown and "db='postgresql://app:***@db:5432/h?schema=s'" in shown
    assert "port=8123" in shown
    assert "token=None" in repr(Settings()) and "db=None" in repr(Settings())


@pytest.mark.parametrize("name", ["token", "host"])
def test_an_empty_token_or_host_given_explicitly_is_refused_even_over_the_environment(
    name: str,
) -> None:
    """``--token "$TOKEN"`` with TOKEN unset served with no authentication (even over
    HEARTH_TOKEN=secret); ``--host ""`` bound every interface."""
    env = {"HEARTH_TOKEN": "secret", "HEARTH_HOST": "127.0.0.1"}
    with pytest.raises(ConfigurationError, match=f"{name} is empty"):
        Settings.resolve(env=env, **{name: ""})
    with pytest.raises(ConfigurationError, match=f"{name} is empty"):
        hearth.App(serverapp.AGENTS, providers=serverapp.MODELS, **{name: ""})
    app = hearth.App(serverapp.AGENTS, providers=serverapp.MODELS)
    with pytest.raises(ConfigurationError, match=f"{name} is empty"):
        app.configure(**{name: ""})


def test_an_empty_hearth_token_is_refused_not_read_as_no_auth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HEARTH_TOKEN=$TOKEN`` with TOKEN unset served every route with no authentication, where
    ``--token ""`` was refused. Other empty variables still mean their default."""
    with pytest.raises(ConfigurationError, match="HEARTH_TOKEN is set but empty"):
        Settings.resolve(env={"HEARTH_TOKEN": ""})
    assert Settings.resolve(env={"HEARTH_TOKEN": ""}, token="given").token == "given"
    assert Settings.resolve(env={"HEARTH_PORT": "", "HEARTH_DB": ""}).port == 8000
    monkeypatch.setenv("HEARTH_TOKEN", "")
    with pytest.raises(ConfigurationError, match="HEARTH_TOKEN is set but empty"):
        hearth.App(serverapp.AGENTS, providers=serverapp.MODELS)


def test_a_shown_database_url_masks_a_password_given_as_a_parameter() -> None:
    """``?password=`` went into the ready line and messages in clear."""
    assert shown_db("postgresql://app@db:5432/h?password=s3cret&schema=s") == (
        "postgresql://app@db:5432/h?password=***&schema=s"
    )
    assert shown_db("postgresql:///h?host=/run/pg&password=s3cret") == (
        "postgresql:///h?host=/run/pg&password=***"
    )


@pytest.mark.parametrize(
    "url",
    [
        "postgresql:///app?host=/run/postgresql&port=5433&schema=s",  # libpq's Unix socket
        "postgresql://u:pw@db1:5432,db2:5433/app?schema=s&target_session_attrs=read-write",
    ],
)
def test_libpq_url_forms_are_taken_with_only_the_schema_parameter_removed(url: str) -> None:
    """Both were refused as malformed: one lost its empty host when rebuilt, the other's
    ports were read as one number."""
    from hearth.store import open_store
    from hearth.store.postgres import PostgresStore

    Settings.resolve(env={"HEARTH_DB": url})
    store = open_store(url)
    assert isinstance(store, PostgresStore) and store.schema == "s"
    assert store.conninfo == url.replace("schema=s&", "").replace("&schema=s", "")


@pytest.mark.parametrize(
    ("name", "value"),
    [("workers", 2.9), ("port", 8000.9), ("max_body", 1.99), ("workers", 0.5), ("pg_pool", True)],
)
def test_an_app_argument_that_is_not_a_whole_number_is_refused_as_the_variable_is(
    name: str, value: object
) -> None:
    """``App(workers=2.9)`` became 2 (``HEARTH_WORKERS=2.9`` is refused), ``workers=0.5`` was
    refused as 0, a value nobody wrote, and ``True`` was taken as 1."""
    with pytest.raises(ConfigurationError, match=f"{name}: {value!r} is not a valid {name}"):
        hearth.App(serverapp.AGENTS, providers=serverapp.MODELS, **{name: value})
    with pytest.raises(ConfigurationError, match="is not a valid"):
        Settings.resolve(env={f"HEARTH_{name.upper()}": str(value)})


def test_seconds_are_not_booleans_and_whole_floats_are_whole_numbers() -> None:
    with pytest.raises(ConfigurationError, match="lease_s: True is not a valid lease_s"):
        hearth.App(serverapp.AGENTS, providers=serverapp.MODELS, lease_s=True)
    settings = Settings.resolve(env={}, workers=8.0, port="9000", lease_s=20)
    assert (settings.workers, settings.port, settings.lease_s) == (8, 9000, 20.0)
    assert type(settings.workers) is int and type(settings.lease_s) is float
