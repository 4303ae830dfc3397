"""Connections the network stranded, found by asking the server about them.

A flow dropped between this process and PostgreSQL (a firewall or NAT table flushed, a
failover of a middlebox) leaves each connection on it waiting for an answer that will never
come, and its try is given up only at its time limit (up to 30 s for a write). The server knows
better: a session whose client waits on it but which has had nothing to do for a while (its
state ``idle``: not running a statement, not inside a transaction) either never received what
was sent, or answered and the answer was lost. But a session also shows ``idle`` once its
answer is in the kernel's buffers, which a large answer on a slow link takes seconds to leave:
so this process's own socket must also have received nothing for as long (Linux's ``TCP_INFO``;
where it cannot tell, nothing is cut). Such a connection is cut at once, and the try is retried
on another as after any lost connection (a write read back first).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator

import psycopg

from hearth.store import postgres_ops as ops
from hearth.store.postgres_deadline import cut

log = logging.getLogger("hearth.store.postgres")

# Which of the sessions asked about have had nothing to do for longer than ``quiet``: a try in
# flight shows its session active or in a transaction, at most a network delay after it began.
# (A session the server does not show, or with activity tracking off, is never taken.)
_IDLE_SESSIONS = (
    "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%(pids)s) AND state = 'idle'"
    " AND clock_timestamp() - state_change > make_interval(secs => %(quiet)s)"
)


# ``struct tcp_info``'s ``tcpi_last_data_recv``: milliseconds since data last arrived (Linux).
_LAST_DATA_RECV_AT = 52


def receiving_quiet_s(conn: ops.Conn) -> float | None:
    """How long ``conn``'s socket has received no data; None when that cannot be told (not
    Linux, a Unix socket, a closed connection)."""
    info_option = getattr(socket, "TCP_INFO", None)
    if info_option is None:
        return None
    try:
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            info = sock.getsockopt(socket.IPPROTO_TCP, info_option, 104)
    except (OSError, psycopg.Error):
        return None
    if len(info) < _LAST_DATA_RECV_AT + 4:
        return None
    quiet_ms: int = struct.unpack_from("I", info, _LAST_DATA_RECV_AT)[0]
    return quiet_ms / 1000


class Tries:
    """The tries waiting on connections of one pool, and since when."""

    def __init__(self) -> None:
        self._waiting: dict[int, tuple[ops.Conn, float]] = {}

    @contextlib.contextmanager
    def waiting(self, conn: ops.Conn) -> Iterator[None]:
        """Count a try on ``conn`` as waiting while the block runs."""
        self._waiting[id(conn)] = (conn, time.monotonic())
        try:
            yield
        finally:
            self._waiting.pop(id(conn), None)

    def longer_than(self, seconds: float) -> dict[int, tuple[ops.Conn, float]]:
        """The tries waiting longer than ``seconds`` (each its connection and when it began),
        by their session's pid."""
        since = time.monotonic() - seconds
        return {
            conn.info.backend_pid: (conn, began)
            for conn, began in list(self._waiting.values())
            if began < since and not conn.closed
        }

    async def cut_stranded(self, conn: ops.Conn, quiet: float) -> int:
        """Ask on ``conn`` (not one of those waiting) whether the session of any try waiting
        longer than ``quiet`` seconds has had nothing to do for as long, and cut the
        connection of each that has, still waits on it, and has received nothing for as long.
        How many were cut; without such tries, a ``SELECT 1``."""
        long = self.longer_than(quiet)
        if not long:
            await conn.execute("SELECT 1")
            return 0
        cursor = await conn.execute(_IDLE_SESSIONS, {"pids": list(long), "quiet": quiet})
        idle = [row["pid"] for row in await cursor.fetchall()]
        # A try that ended meanwhile is not cut: its answer was there, unread, when the server
        # was asked (this process had stood still), and its connection may carry another now.
        stranded = [
            long[pid]
            for pid in idle
            if self._waiting.get(id(long[pid][0])) == long[pid]
            and (receiving_quiet_s(long[pid][0]) or 0.0) >= quiet
        ]
        for stuck, began in stranded:
            log.warning(
                "a connection to PostgreSQL waited %.1f s for an answer the server had already"
                " given or never received (the network lost it): cut, and its work tried again",
                time.monotonic() - began,
            )
            cut(stuck)
        return len(stranded)
