"""The PostgreSQL store on databases and roles a DBA configured: hearth pins the settings it
relies on for its own sessions, and refuses at open, saying what to do, a database it cannot
work on."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from pgcluster import Cluster, new_schema

from hearth.errors import StoreError, StoreUnavailable
from hearth.store import NewSubmission
from hearth.store.postgres import PostgresStore
from hearth.store.postgres_schema import _LOCK_KEY

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.contextmanager
def database(pg_cluster: Cluster, *settings: str, options: str = "") -> Iterator[str]:
    """A database of its own with ``settings`` (``ALTER DATABASE ... SET``): its URL."""
    name = f"d_{uuid.uuid4().hex[:12]}"
    pg_cluster.sql(f"CREATE DATABASE {name} {options}")
    try:
        for setting in settings:
            pg_cluster.sql(f"ALTER DATABASE {name} SET {setting}")
        yield pg_cluster.conninfo.rsplit("/", 1)[0] + f"/{name}"
    finally:
        pg_cluster.sql(f"DROP DATABASE {name} WITH (FORCE)")


@contextlib.asynccontextmanager
async def opened(conninfo: str, schema: str | None = None) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(conninfo, schema=schema or new_schema())
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_a_dbas_idle_session_timeout_does_not_end_the_listeners_session(
    pg_cluster: Cluster,
) -> None:
    """The listener's connection is idle by design: the server ended it over and over, each
    time with a warning of a lost connection and notifications missed meanwhile."""
    with database(pg_cluster, "idle_session_timeout = '200ms'") as url:
        async with opened(url) as store:
            listening = store.listener_pid
            assert listening is not None
            await asyncio.sleep(0.8)
            assert store.listener_pid == listening
            assert store._listener is not None and store._listener.connected.is_set()


async def _keeps_text_as_written(url: str) -> None:
    async with opened(url) as store:
        text = "hi ✓ — 日本"
        admission = await store.admit(NewSubmission("a/c", "a", "message", {"message": text}))
        found = await store.get_submission(admission.submission.id)
        assert found is not None
        assert isinstance(found.id, str) and found.id == admission.submission.id
        assert found.payload == {"message": text}


async def test_a_sql_ascii_database_keeps_text_as_written(pg_cluster: Cluster) -> None:
    """psycopg returned bytes for every text column there (ids as b'...'): no attempt could
    run, and the next start failed reading the schema's version."""
    options = "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    with database(pg_cluster, options=options) as url:
        await _keeps_text_as_written(url)


async def test_a_dbas_client_encoding_does_not_refuse_text_outside_it(pg_cluster: Cluster) -> None:
    """A database's client_encoding of LATIN1 made an admission of "✓" a UnicodeEncodeError
    (an HTTP 500)."""
    with database(pg_cluster, "client_encoding = 'LATIN1'") as url:
        await _keeps_text_as_written(url)


async def test_a_database_whose_encoding_cannot_hold_unicode_is_refused_at_open(
    pg_cluster: Cluster,
) -> None:
    options = "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    with database(pg_cluster, options=options) as url:
        store = PostgresStore(url, schema=new_schema())
        with pytest.raises(StoreError, match=r"encoding is LATIN1.*ENCODING 'UTF8'"):
            await store.open()
        await store.close()


async def test_a_read_only_database_is_refused_at_open_naming_target_session_attrs(
    pg_cluster: Cluster,
) -> None:
    """A read-only server (a standby, default_transaction_read_only) was served: /healthz 200
    and every admission 503, for good."""
    schema = new_schema()
    with database(pg_cluster) as url:
        store = PostgresStore(url, schema=schema)
        await store.open()  # the schema is there, as on a primary's standby
        await store.close()
        name = url.rsplit("/", 1)[1]
        pg_cluster.sql(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
        store = PostgresStore(url, schema=schema)
        with pytest.raises(StoreError, match=r"read-only.*target_session_attrs=read-write"):
            await store.open()
        await store.close()


async def test_a_ping_fails_once_the_server_is_read_only(pg_cluster: Cluster) -> None:
    """After a failover that left the URL on a standby, /healthz answered 200 while every
    admission failed: a balancer kept sending traffic there."""
    store = PostgresStore(pg_cluster.conninfo, schema=new_schema(), pool_size=1)
    await store.open()
    try:
        await store.ping(2.0)
        assert store._transactions is not None
        async with store._transactions.pool.connection() as conn:
            await conn.execute("SET default_transaction_read_only = on")  # as a standby's
        with pytest.raises(StoreUnavailable, match="read-only"):
            await store.ping(2.0)
    finally:
        await store.close()


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
async def test_a_dbas_isolation_level_does_not_fail_a_start_racing_another(
    pg_cluster: Cluster, isolation: str
) -> None:
    """The migration's snapshot was taken as it asked for the lock, before the wait: the schema
    a peer created meanwhile was not there for it, and its CREATE SCHEMA failed."""
    schema = new_schema()
    with database(pg_cluster, f"default_transaction_isolation = '{isolation}'") as url:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as peer:
            await peer.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
            store = PostgresStore(url, schema=schema)
            opening = asyncio.create_task(store.open())
            await asyncio.sleep(0.5)  # waiting for the lock
            assert not opening.done()
            await peer.execute(f"CREATE SCHEMA {schema}")  # the peer's migration, in short
            await peer.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
            try:
                await opening
                await store.admit(NewSubmission("a/c", "a", "message", {"message": "hi"}))
            finally:
                await store.close()


@contextlib.asynccontextmanager
async def role_on_a_dbas_schema(
    pg_cluster: Cluster, *grants: str, tables: bool = True
) -> AsyncIterator[tuple[str, str]]:
    """A schema made by the cluster's superuser (with hearth's tables, unless not ``tables``),
    and a role given ``grants`` there (``{s}``: the schema, ``{r}``: the role): the role's URL
    and the schema."""
    schema, role = new_schema(), f"r_{uuid.uuid4().hex[:12]}"
    pg_cluster.sql(f"CREATE ROLE {role} LOGIN")
    try:
        pg_cluster.sql(f"CREATE SCHEMA {schema}")
        if tables:
            async with opened(pg_cluster.conninfo, schema):
                pass
        for grant in grants:
            pg_cluster.sql(grant.format(s=schema, r=role))
        yield pg_cluster.conninfo.replace("postgres@", f"{role}@", 1), schema
    finally:
        pg_cluster.sql(f"DROP SCHEMA {schema} CASCADE; DROP OWNED BY {role}; DROP ROLE {role}")


async def _refused(url: str, schema: str, match: str) -> None:
    store = PostgresStore(url, schema=schema)
    with pytest.raises(StoreError, match=match):
        await store.open()
    await store.close()


_TABLES = "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}"
_SEQUENCES = "GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {r}"
_USAGE = "GRANT USAGE ON SCHEMA {s} TO {r}"


@pytest.mark.parametrize("grants", [(), (_TABLES, _SEQUENCES)], ids=["none", "tables only"])
async def test_a_role_that_may_not_use_a_dbas_schema_is_told_to_grant_usage_on_it(
    pg_cluster: Cluster, grants: tuple[str, ...]
) -> None:
    """The schema was skipped as if it were not there: "no schema has been selected to create
    in", or "relation meta does not exist" once given the very grants the advice named."""
    async with role_on_a_dbas_schema(pg_cluster, *grants) as (url, schema):
        await _refused(url, schema, f"USAGE ON SCHEMA {schema}")


async def test_a_role_that_may_use_a_dbas_schema_but_not_its_tables_is_told_which_grants(
    pg_cluster: Cluster,
) -> None:
    """The tables were looked for where only those the role has a privilege on are shown: it
    was told to grant CREATE on the database."""
    async with role_on_a_dbas_schema(pg_cluster, _USAGE) as (url, schema):
        await _refused(url, schema, "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA")
    async with role_on_a_dbas_schema(pg_cluster, _USAGE, _TABLES, _SEQUENCES) as (url, schema):
        async with opened(url, schema) as store:
            await store.admit(NewSubmission("a/c", "a", "message", {"message": "hi"}))


async def test_a_role_that_may_not_create_in_an_empty_dbas_schema_is_told_so(
    pg_cluster: Cluster,
) -> None:
    async with role_on_a_dbas_schema(pg_cluster, _USAGE, tables=False) as (url, schema):
        await _refused(url, schema, f"CREATE ON SCHEMA {schema}")
