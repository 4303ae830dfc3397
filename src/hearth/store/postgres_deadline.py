"""Giving up on a PostgreSQL connection that stopped answering, without waiting on it.

A connection whose peer went silent (a dropped flow, a proxy or a host that hangs) answers
nothing and fails nothing: a query on it waits until the kernel gives up, if it ever does. And
cancelling the task that waits does not end it soon either: psycopg then asks the server to
cancel the query, on a new connection, and waits for its answer, up to 10 s more. ``within``
stops waiting at a deadline instead, and shuts the connection's socket down under the work, so
that the work ends at once with a lost connection and the pool discards that connection.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")

# Once its connection is cut, how long the abandoned try has to end (it ends at once: its
# socket is shut down under it) before this caller stops waiting for it.
CUT_WAIT_S = 1.0
_TICK_S = 0.5


class Stalled(psycopg.OperationalError):
    """A try that got no answer within its time: its connection was cut (``within``), and the
    work, if it wrote, may or may not have committed."""


def cut(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shut ``conn``'s socket down under whatever waits on it: that wait ends at once with a
    lost connection, and the pool discards the connection when it comes back. (Cancelling the
    waiting task instead makes psycopg send a cancel request on a new connection and wait for
    the server's answer, up to 10 s more, on a server that does not answer.)"""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return  # closed already
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more: nothing to wake


async def within(conn: psycopg.AsyncConnection[Any], work: Awaitable[T], seconds: float) -> T:
    """``work`` (on ``conn``), or ``Stalled`` once it has gone ``seconds`` without finishing:
    then ``conn`` is cut, so that what waits on it ends and the pool replaces it, and work that
    still has not ended ``CUT_WAIT_S`` later (it was not waiting on the server: the
    application's own code in a step.transaction, say) is cancelled. Work that finished all the
    same as it was cut is its answer. Cancelling the caller cancels ``work`` as psycopg does
    it: the server is asked to cancel the query (a cut alone would leave it running there,
    holding its locks, until it next wrote to the socket).

    The work runs in the caller's task, watched by a timer: run as a task of its own, waited
    for, it took three more turns of the event loop, a tenth of a millisecond a step."""
    watch = _Watch(asyncio.get_running_loop(), conn, seconds)
    try:
        async with asyncio.timeout(None) as watch.deadline:
            return await work
    except Exception as exc:
        if watch.cut:  # (a TimeoutError: it did not end within CUT_WAIT_S of the cut)
            raise Stalled(f"the server gave no answer within {seconds:.1f} s") from exc
        raise
    finally:
        watch.stop()


class _Watch:
    """The time a try has had, counted in ticks of at most ``_TICK_S``; at its end, the cut.
    Time in which the process did not run (stopped, its host suspended) counts as one short
    tick: the server's answer came meanwhile, and is read once the process runs again; its
    connection is fine."""

    __slots__ = ("_began", "_handle", "_loop", "_tick", "conn", "cut", "deadline", "seconds")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, conn: psycopg.AsyncConnection[Any], seconds: float
    ) -> None:
        self._loop, self.conn, self.seconds = loop, conn, seconds
        self.cut = False
        self.deadline: asyncio.Timeout | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._arm(0.0)

    def _arm(self, waited: float) -> None:
        self._tick = min(_TICK_S, self.seconds - waited)
        self._began = time.monotonic()
        self._handle = self._loop.call_later(self._tick, self._ticked, waited)

    def _ticked(self, waited: float) -> None:
        waited += min(time.monotonic() - self._began, self._tick + _TICK_S)
        if waited < self.seconds:
            self._arm(waited)
            return
        self._handle = None
        self.cut = True
        cut(self.conn)
        if self.deadline is not None:
            self.deadline.reschedule(self._loop.time() + CUT_WAIT_S)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
