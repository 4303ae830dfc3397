"""hearth's settings on each PostgreSQL session it opens.

They are SET once a connection is made (the pool's ``configure``, the listener's connection, a
connection made alone), not sent in libpq's startup ``options``: a pooler such as pgbouncer
refuses that parameter, and one told to ignore it drops it, so every statement would have run
in the role's default schema (another deployment's, when the role is named as that schema).
"""

from __future__ import annotations

from typing import Any

import psycopg

from hearth.errors import StoreError

# Given with every connection (a startup parameter, which poolers pass on): hearth writes and reads
# text as UTF-8. A database's or role's client_encoding (LATIN1, say), or PGCLIENTENCODING, made
# any other character an error; a SQL_ASCII database's default made psycopg return bytes for text.
CONNECT_KWARGS: dict[str, Any] = {"client_encoding": "UTF8"}
# Server encodings that hold any text hearth writes (SQL_ASCII keeps the UTF-8 bytes as given).
_ENCODINGS = frozenset({"UTF8", "SQL_ASCII"})

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


async def apply(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Set hearth's session settings on ``conn`` (in autocommit: they outlive the statement)."""
    await conn.execute(settings(schema, conn.info.server_version))


async def check_server(conn: psycopg.AsyncConnection[Any], where: str) -> None:
    """Refuse, saying what to do, a database hearth cannot work on: one whose encoding cannot
    hold all of Unicode (it would fail the work whose text it cannot hold)."""
    cursor = await conn.execute("SELECT current_setting('server_encoding')")
    row = await cursor.fetchone()
    encoding = str(row[0]) if row else "UTF8"
    if encoding.upper() not in _ENCODINGS:
        raise StoreError(
            f"{where}: the database's encoding is {encoding}, which cannot hold all the text"
            " hearth stores; give hearth a database created with ENCODING 'UTF8' (CREATE DATABASE"
            " name ENCODING 'UTF8' TEMPLATE template0)"
        )
