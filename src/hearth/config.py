"""Settings: an ``App(...)`` argument wins over a ``hearth serve`` option, which wins over the
environment (``HEARTH_*``), which wins over the default."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from hearth.errors import ConfigurationError

LOG_FORMATS = ("text", "json")
MAX_SECONDS = 86_400.0 * 365  # a lease, a heartbeat, a scan or a shutdown: a year at most
MAX_COUNT = 1_000_000  # workers, connections, streams: beyond, a typo (and past SQLite's ints)


@dataclass(frozen=True)
class Settings:
    db: str | None = None  # None → ./hearth.db
    token: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    lease_s: float = 30.0
    heartbeat_s: float = 10.0
    scan_s: float = 15.0
    workers: int = 64
    max_body: int = 1024 * 1024
    max_attachment: int = 20 * 1024 * 1024  # bytes per attached file
    max_upload: int = 64 * 1024 * 1024  # bytes per request that carries attachments
    shutdown_s: float = 30.0
    pg_pool: int = 10  # connections per process to a PostgreSQL store
    max_streams: int = 2000  # open SSE streams per process; past it, 503
    log_format: str = "text"  # "text" or "json" (one JSON object per line)

    def __repr__(self) -> str:
        # Settings end up in tracebacks and debug prints: never the token nor a password.
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["token"] = None if self.token is None else "***"
        shown["db"] = None if self.db is None else shown_db(self.db)
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @classmethod
    def resolve(cls, env: dict[str, str] | None = None, **given: Any) -> Settings:
        """Build settings from explicit values (None = not given), then ``HEARTH_*``, then
        defaults. Bad values raise ``ConfigurationError`` naming the variable."""
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            explicit = given.pop(f.name, None)
            var = f"HEARTH_{f.name.upper()}"
            if explicit is not None:
                values[f.name] = _convert(f.name, explicit, f.type, source=f.name)
            elif env.get(var):
                values[f.name] = _convert(f.name, env[var], f.type, source=var)
            elif f.name == "token" and var in env:
                # Other empty variables mean their default; this one would mean no auth at all.
                raise ConfigurationError(
                    f"{var} is set but empty (an unset variable in a deploy script?): give the"
                    " token, or unset it to serve without one"
                )
        if given:
            raise ConfigurationError(f"unknown settings: {', '.join(sorted(given))}")
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        for name in ("lease_s", "heartbeat_s", "scan_s", "shutdown_s"):
            value = getattr(self, name)
            # (NaN passes every comparison's "not": it is refused by name.)
            if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
                raise ConfigurationError(
                    f"{name} must be a number of seconds above 0 and at most"
                    f" {MAX_SECONDS:,.0f} (a year), not {value!r}"
                )
        if not 0 <= self.port <= 65535:
            raise ConfigurationError(f"port must be from 0 to 65535, not {self.port}")
        if not 1 <= self.workers <= MAX_COUNT:
            raise ConfigurationError(f"workers must be from 1 to {MAX_COUNT:,}")
        if not 1 <= self.pg_pool <= MAX_COUNT:
            raise ConfigurationError(f"pg_pool must be from 1 to {MAX_COUNT:,} connections")
        if not 1 <= self.max_streams <= MAX_COUNT:
            raise ConfigurationError(f"max_streams must be from 1 to {MAX_COUNT:,}")
        # Given but empty is an unset variable (--token "$TOKEN"): never "no auth", nor "all".
        if self.token == "":
            raise ConfigurationError(
                "token is empty (an unset variable?): give the token, or leave it out to serve"
                " without one"
            )
        if not self.host.strip():
            raise ConfigurationError(
                "host is empty (an unset variable?): give the interface to bind, such as"
                " 127.0.0.1, or 0.0.0.0 for every one"
            )
        if self.token is not None and not (
            self.token.isascii() and self.token.isprintable() and self.token.strip() == self.token
        ):
            raise ConfigurationError(
                "token must be printable ASCII without spaces at its ends: it travels in an"
                " HTTP header (Authorization: Bearer ...)"
            )
        if self.log_format not in LOG_FORMATS:
            raise ConfigurationError(
                f"log_format must be one of {', '.join(LOG_FORMATS)}, not {self.log_format!r}"
            )
        if self.max_body < 1:
            raise ConfigurationError("max_body must be at least 1 byte")
        if self.max_attachment < 1 or self.max_upload < 1:
            raise ConfigurationError("max_attachment and max_upload must be at least 1 byte")
        if self.heartbeat_s >= self.lease_s:
            raise ConfigurationError("heartbeat_s must be shorter than lease_s")
        check_db_url(self.db)


def check_db_url(db: str | None) -> None:
    """A PostgreSQL URL that cannot even be parsed is a configuration error now, not a failed
    connection later."""
    scheme = (db or "").partition("://")[0].strip().lower()
    if scheme not in ("postgresql", "postgres"):
        return
    assert db is not None
    try:
        postgres_conninfo(db)
    except ValueError as exc:
        raise ConfigurationError(
            f"the database URL {shown_db(db)!r} is malformed ({exc}); write it as"
            " postgresql://user:password@host:port/dbname?schema=NAME"
        ) from None


def postgres_conninfo(url: str) -> tuple[str, str | None]:
    """The libpq URI of a hearth PostgreSQL URL and the schema it names (None: none named).

    Only hearth's own ``schema=`` is taken out; the rest goes to libpq as written, so its forms
    work (a Unix socket as ``postgresql:///db?host=/run/postgresql``, several hosts as
    ``postgresql://u@h1:5432,h2:5432/db``). Raises ``ValueError`` without the password.
    """
    scheme, _, rest = url.strip().partition("://")
    base, has_query, query = rest.partition("?")
    if base.partition("/")[0].count("@") > 1:
        # libpq ends the user information at the first @: the rest of the password would be
        # taken for the host, and named as one in every error.
        raise ValueError("an @ in the user name or password must be written %40")
    kept: list[str] = []
    schemas: list[str] = []
    for param in query.split("&") if has_query else []:
        key, _, value = param.partition("=")
        if unquote_plus(key) == "schema":
            schemas.append(unquote_plus(value))
        elif param:
            kept.append(param)
    if len(schemas) > 1 or (schemas and not schemas[0]):
        raise ValueError("give ?schema= once, with a name")
    conninfo = f"{scheme.lower()}://{base}" + (f"?{'&'.join(kept)}" if kept else "")
    _check_conninfo(conninfo)
    return conninfo, schemas[0] if schemas else None


def _check_conninfo(conninfo: str) -> None:
    """libpq's own reading of the URI, and its ports (which libpq checks only on connecting)."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # without the extra, opening the store says what to install
        return
    try:
        info = conninfo_to_dict(conninfo)
    except Exception as exc:  # psycopg.ProgrammingError; its text quotes the whole URI
        said = str(exc).replace(conninfo, shown_db(conninfo)).strip().splitlines()
        raise ValueError(said[0] if said else type(exc).__name__) from None
    for port in str(info.get("port") or "").split(","):
        if port and not (port.isdigit() and int(port) <= 65535):
            raise ValueError(f"the port {port!r} is not a number from 0 to 65535")


def _convert(name: str, value: Any, kind: Any, *, source: str) -> Any:
    text = str(kind)
    conv: Callable[[Any], Any]
    what = name
    if "float" in text:
        conv = _number
    elif "int" in text:
        conv, what = _whole, f"{name} (a whole number)"
    else:
        conv = str
    try:
        return conv(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{source}: {value!r} is not a valid {what}") from None


def _number(value: Any) -> float:
    if isinstance(value, bool):  # True is 1 to Python, never a number of seconds to a reader
        raise TypeError(value)
    return float(value)


def _whole(value: Any) -> int:
    """As ``HEARTH_WORKERS=2.9`` is refused, ``App(workers=2.9)`` is: never cut to 2."""
    if isinstance(value, str):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(value)
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return int(value)


def shown_db(db: str | None) -> str:
    """The database URL as messages show it: the default spelled out, any password masked (in
    the user information or as a ``password=`` parameter)."""
    if db is None:
        return "./hearth.db"
    db = _QUERY_PASSWORD.sub(r"\1***", db)
    try:
        parts = urlsplit(db)
        password = parts.password
    except ValueError:  # malformed: mask whatever sits between user: and @
        return _USERINFO.sub(r"\1:***@", db)
    if password is None:
        return db
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/]*):[^/]*@")  # to the last @
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
