"""hearth's settings on each PostgreSQL session it opens.

They are SET once a connection is made (the pool's ``configure``, the listener's connection, a
connection made alone), not sent in libpq's startup ``options``: a pooler such as pgbouncer
refuses that parameter, and one told to ignore it drops it, so every statement would have run
in the role's default schema (another deployment's, when the role is named as that schema).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import tuple_row

from hearth.errors import StoreError

# Given with every connection (a startup parameter, which poolers pass on): hearth writes and reads
# text as UTF-8. A database's or role's client_encoding (LATIN1, say), or PGCLIENTENCODING, made
# any other character an error; a SQL_ASCII database's default made psycopg return bytes for text.
CONNECT_KWARGS: dict[str, Any] = {"client_encoding": "UTF8"}
# A connection whose peer went silent (a firewall dropping a flow, a host that vanished, a
# half-open NAT entry) would otherwise be waited on until the kernel gives up: hours with no data
# in flight, 15 minutes with some. With these, the kernel probes an idle connection after 5 s and
# gives up after 3 unanswered probes 2 s apart, or once data sent stays unacknowledged for 15 s:
# a dead peer fails its connection within about 15 s. A URL that sets any of them keeps its own.
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}
# Server encodings that hold any text hearth writes (SQL_ASCII keeps the UTF-8 bytes as given).
_ENCODINGS = frozenset({"UTF8", "SQL_ASCII"})


def network_kwargs(conninfo: str) -> dict[str, Any]:
    """``KEEPALIVES``, less those that ``conninfo`` sets (libpq takes keyword arguments over
    the URL's, so the URL's would be lost otherwise)."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        given = {}  # the connection itself will say what is wrong with the URL
    return {key: value for key, value in KEEPALIVES.items() if key not in given}


# A process frozen inside a transaction (SIGSTOP, a stalled VM) would hold its row locks, and so
# block the peer that takes its work over, for as long as it is frozen: the server ends such a
# transaction after a while instead.
IDLE_IN_TRANSACTION_MS = 10_000


def settings(schema: str, server_version: int) -> str:
    """hearth's session settings on a server of ``server_version``, as one simple query (one
    round trip, and ``RESET ALL`` followed by it restores them in the same one)."""
    # (``schema`` is 1-63 lower-case letters, digits or _: quoted, it is taken as written.)
    statements = [
        f'SET search_path TO "{schema}"',
        f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}",
    ]
    if server_version >= 140000:
        # A DBA's idle_session_timeout would end the listener's connection (idle by design)
        # over and over, each time missing notifications and logging a lost connection.
        statements.append("SET idle_session_timeout = 0")
    return "; ".join(statements)


# ``Store.ping``'s question: whether the server answers, and may still be written (a failover
# that left the URL on a standby: a balancer should send the traffic elsewhere).
PING = "SELECT current_setting('transaction_read_only') AS read_only"


async def apply(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Set hearth's session settings on ``conn`` (in autocommit: they outlive the statement),
    and note its session's process id on the server (``server_pid``)."""
    # (one round trip: the settings, then the pid, whose answer is the one with rows)
    query = settings(schema, conn.info.server_version) + "; SELECT pg_backend_pid() AS pid"
    cursor = await conn.execute(query)
    pid = 0
    while True:
        if cursor.description is not None:
            row = await cursor.fetchone()
            if row is not None:
                pid = int(row["pid"] if isinstance(row, dict) else row[0])
        if not cursor.nextset():
            break
    setattr(conn, _SERVER_PID, pid)


_SERVER_PID = "_hearth_server_pid"


def server_pid(conn: psycopg.AsyncConnection[Any]) -> int:
    """The process id of ``conn``'s session on the server, 0 when unknown. (Not libpq's
    ``backend_pid``: behind a pooler such as pgbouncer that is the pooler's own key.)"""
    pid: int = getattr(conn, _SERVER_PID, 0)
    return pid


async def check_server(conn: psycopg.AsyncConnection[Any], where: str) -> None:
    """Refuse, saying what to do, a database hearth cannot work on: one whose encoding cannot
    hold all of Unicode (it would fail the work whose text it cannot hold), and a read-only one
    (a hot standby, a role or database set read-only): it would start, answer /healthz, and
    fail every admission for good."""
    cursor = conn.cursor(row_factory=tuple_row)
    await cursor.execute(
        "SELECT current_setting('server_encoding'), current_setting('transaction_read_only'),"
        " pg_is_in_recovery()"
    )
    row = await cursor.fetchone()
    assert row is not None
    encoding, read_only, standby = str(row[0]), row[1] == "on", bool(row[2])
    if encoding.upper() not in _ENCODINGS:
        raise StoreError(
            f"{where}: the database's encoding is {encoding}, which cannot hold all the text"
            " hearth stores; give hearth a database created with ENCODING 'UTF8' (CREATE DATABASE"
            " name ENCODING 'UTF8' TEMPLATE template0)"
        )
    if standby or read_only:
        why = "a standby" if standby else "default_transaction_read_only is on"
        raise StoreError(
            f"{where} is read-only ({why}) and hearth writes to its database: point the URL at"
            " the primary (with several hosts, add ?target_session_attrs=read-write)"
        )


async def check_sessions(
    conn: psycopg.AsyncConnection[Any],
    alone: psycopg.AsyncConnection[Any],
    schema: str,
    where: str,
) -> None:
    """Refuse a pooler in transaction mode between hearth and the server: ``conn``'s session
    must outlive its statements while ``alone`` (made and set as the pool's connections are)
    has another of its own. There, a session's prepared statements, ``LISTEN`` and settings are
    lost between transactions, and work admitted would fail later. And refuse settings that did
    not take: statements in a schema other than hearth's would read and write another's tables."""
    first = await _backend(conn)
    other = await _backend(alone)
    again = await _backend(conn)
    if other[0] == first[0] or again[0] != first[0]:
        raise StoreError(
            f"{where} does not keep a session across transactions: a pooler in transaction mode"
            " (pgbouncer's pool_mode = transaction) is in between, and hearth keeps prepared"
            " statements, a LISTEN and its settings on each session; connect directly, or"
            " through a pooler in session mode"
        )
    if other[1] != schema:
        raise StoreError(
            f"{where}: hearth's connections do not use the schema {schema!r} they set (they"
            f" use {other[1]!r}); check that this role may use it (GRANT USAGE ON SCHEMA"
            f" {schema})"
        )


async def _backend(conn: psycopg.AsyncConnection[Any]) -> tuple[int, str | None]:
    """The pid of the server process that answers on ``conn``, and its schema."""
    cursor = conn.cursor(row_factory=tuple_row)
    await cursor.execute("SELECT pg_backend_pid(), current_schema()")
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0]), row[1]
