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
    then ``conn`` is cut, so that what waits on it ends and the pool replaces it. Work that
    finished all the same as it was cut is its answer. Cancelling the caller cancels ``work``
    as psycopg does it: the server is asked to cancel the query (a cut alone would leave it
    running there, holding its locks, until it next wrote to the socket)."""
    task = asyncio.ensure_future(work)
    try:
        done = await _wait(task, seconds)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task})
        raise
    if not done:
        await _abandon(conn, task)
        if not task.done() or task.cancelled() or task.exception() is not None:
            raise Stalled(f"the server gave no answer within {seconds:.1f} s")
    return task.result()


async def _wait(task: asyncio.Future[Any], seconds: float) -> bool:
    """Whether ``task`` finished within ``seconds`` of this process running. Time in which the
    process did not run (stopped, its host suspended) counts as one short tick: the server's
    answer came meanwhile, and is read once the process runs again; its connection is fine."""
    waited = 0.0
    while waited < seconds:
        tick = min(_TICK_S, seconds - waited)
        began = time.monotonic()
        done, _ = await asyncio.wait({task}, timeout=tick)
        if done:
            return True
        waited += min(time.monotonic() - began, tick + _TICK_S)
    return task.done()


async def _abandon(conn: psycopg.AsyncConnection[Any], task: asyncio.Future[Any]) -> None:
    """Cut ``conn`` under ``task`` and give it a moment to end; then cancel it (it was not
    waiting on the server: the application's own code in a step.transaction, say)."""
    cut(conn)
    task.add_done_callback(_consumed)
    try:
        done, _ = await asyncio.shield(asyncio.wait({task}, timeout=CUT_WAIT_S))
    except asyncio.CancelledError:
        task.cancel()  # the caller is stopped meanwhile: the try is not left running
        raise
    if not done:
        task.cancel()


def _consumed(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned try's outcome (its error is the ``Stalled`` already raised)."""
    if not task.cancelled():
        task.exception()
