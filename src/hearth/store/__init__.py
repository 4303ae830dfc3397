"""Where records and submissions live: the ``Store`` interface and the stores behind a URL.

Example::

    store = open_store("sqlite:////var/lib/app/hearth.db")
    await store.open()   # creates or checks the schema; ``hearth migrate`` does just this
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from hearth.config import postgres_conninfo, shown_db
from hearth.errors import ConfigurationError
from hearth.store.base import (
    JOINED,
    QUEUED,
    RUNNING,
    SETTLED,
    UNSETTLED,
    Admission,
    Blob,
    ConversationInfo,
    Fence,
    Held,
    NewSubmission,
    Store,
    Submission,
)
from hearth.store.events import Event, StoreEvents, StreamNotifier
from hearth.store.sqlite import SQLiteStore

DEFAULT_PATH = "./hearth.db"
_URL_FORMS = "sqlite:///relative/path.db, sqlite:////abs/path.db, a file path, or 'memory'"


def open_store(url: str | None, *, pg_pool: int = 10) -> Store:
    """Make the store a database URL names; ``await store.open()`` before using it.

    ``None`` → the SQLite file ``./hearth.db``; ``"memory"`` → a private in-memory SQLite
    database; ``"sqlite:///hearth.db"`` (relative to the working directory),
    ``"sqlite:////var/lib/hearth.db"`` (absolute: four slashes, as in SQLAlchemy) or a plain
    path → that SQLite file. A SQLite URL may end in ``?synchronous=NORMAL`` (default ``FULL``).
    """
    if url is None:
        return SQLiteStore(DEFAULT_PATH)
    text = url.strip()
    if text == "memory":
        return SQLiteStore(":memory:")
    scheme, sep, rest = text.partition("://")
    if not sep:
        if not text:
            raise ConfigurationError(f"the database URL is empty; use {_URL_FORMS}")
        return SQLiteStore(_sqlite_path(text, url))
    scheme = scheme.lower()
    if scheme in ("postgresql", "postgres"):
        return _postgres(text, pg_pool)
    if scheme != "sqlite":
        raise ConfigurationError(f"unsupported database URL {url!r}; use {_URL_FORMS}")
    path, _, query = rest.partition("?")
    if path.startswith("/"):
        path = path[1:]  # sqlite:///x.db names x.db; sqlite:////abs/x.db names /abs/x.db
    options = dict(parse_qsl(query, keep_blank_values=True))
    synchronous = options.pop("synchronous", "FULL")
    if options:
        raise ConfigurationError(
            f"unknown option(s) in database URL {url!r}: {', '.join(sorted(options))};"
            " only 'synchronous' is understood"
        )
    if not path:
        raise ConfigurationError(f"database URL {url!r} names no file; use {_URL_FORMS}")
    path = ":memory:" if path == ":memory:" else _sqlite_path(path, url)
    return SQLiteStore(path, synchronous=synchronous)


def _sqlite_path(path: str, url: str) -> str:
    """A file path SQLite reads as a path: it reads ``file:...`` as a URI of its own, whose
    ``?mode=memory`` (say) would keep the database off the disk that hearth checks."""
    if path[:5].lower() == "file:":
        raise ConfigurationError(
            f"the database {url!r} is a SQLite URI (file:...), which hearth does not take; give"
            " the file's path, or sqlite:///path"
        )
    return path


def _postgres(url: str, pool_size: int) -> Store:
    try:
        from hearth.store.postgres import PostgresStore
    except ImportError:
        raise ConfigurationError(
            "PostgreSQL URLs need the PostgreSQL extra: pip install 'hearth[postgres]'"
        ) from None
    try:
        conninfo, schema = postgres_conninfo(url)
    except ValueError as exc:
        raise ConfigurationError(f"bad PostgreSQL URL {shown_db(url)}: {exc}") from None
    return PostgresStore(conninfo, schema=schema or "hearth", pool_size=pool_size)


__all__ = [
    "JOINED",
    "QUEUED",
    "RUNNING",
    "SETTLED",
    "UNSETTLED",
    "Admission",
    "Blob",
    "ConversationInfo",
    "Event",
    "Fence",
    "Held",
    "NewSubmission",
    "SQLiteStore",
    "Store",
    "StoreEvents",
    "StreamNotifier",
    "Submission",
    "open_store",
]
