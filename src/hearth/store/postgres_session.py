"""hearth's settings on each PostgreSQL session it opens.

They are SET once a connection is made (the pool's ``configure``, the listener's connection, a
connection made alone), not sent in libpq's startup ``options``: a pooler such as pgbouncer
refuses that parameter, and one told to ignore it drops it, so every statement would have run
in the role's default schema (another deployment's, when the role is named as that schema).
"""

from __future__ import annotations

from typing import Any

import psycopg

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
