"""``within``: a try's time limit on a PostgreSQL connection. No server is needed: one end of a
socket pair stands in for the connection's socket, the other for the server."""

from __future__ import annotations

import asyncio
import socket
import time
import types
from collections.abc import Iterator

import psycopg
import pytest

from hearth.store import postgres_deadline
from hearth.store.postgres_deadline import Stalled, within

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, server = socket.socketpair()
    ours.setblocking(False)
    yield ours, server
    ours.close()
    server.close()


def conn_on(sock: socket.socket) -> psycopg.AsyncConnection[object]:
    return types.SimpleNamespace(pgconn=types.SimpleNamespace(socket=sock.fileno()))  # type: ignore[return-value]


async def answer(sock: socket.socket) -> bytes:
    """What the server sends next; a lost connection as psycopg raises it."""
    data = await asyncio.get_running_loop().sock_recv(sock, 100)
    if not data:
        raise psycopg.OperationalError("the server closed the connection")
    return data


def still_open(ours: socket.socket, server: socket.socket) -> bool:
    try:
        server.send(b"more")
        time.sleep(0.05)
        return ours.recv(100) == b"more"
    except OSError:  # (the server's end sees the cut as a broken pipe)
        return False


async def test_an_answer_in_time_is_returned_and_the_connection_is_never_cut(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, server = pair
    asyncio.get_running_loop().call_later(0.05, server.send, b"ok")
    assert await within(conn_on(ours), answer(ours), 0.3) == b"ok"
    await asyncio.sleep(0.6)  # past the limit: nothing of the watch is left to fire
    assert still_open(ours, server)


async def test_a_silent_server_is_cut_at_the_limit_and_the_try_is_stalled(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, server = pair
    began = time.monotonic()
    with pytest.raises(Stalled, match=r"no answer within 0\.2 s") as raised:
        await within(conn_on(ours), answer(ours), 0.2)
    assert time.monotonic() - began > 0.15
    # ended by the cut (its lost connection), not cancelled CUT_WAIT_S after it (a TimeoutError)
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)
    assert not still_open(ours, server)


async def test_work_that_the_cut_does_not_end_is_cancelled_after_a_moment(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_deadline, "CUT_WAIT_S", 0.2)
    ours, _ = pair
    seen: list[str] = []

    async def deaf() -> None:  # the application's own code, not waiting on the server
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    began = time.monotonic()
    with pytest.raises(Stalled):
        await within(conn_on(ours), deaf(), 0.1)
    assert seen == ["cancelled"]
    assert time.monotonic() - began > 0.25  # the limit, then CUT_WAIT_S


async def test_an_answer_that_came_while_the_process_did_not_run_is_no_stall(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """The process stood still for longer than the try's whole limit (stopped, its host
    suspended: here the event loop is held) while the server's answer arrived: that time
    counts as one short tick, and the connection, which answered, is not cut."""
    ours, server = pair

    def answered_then_stood_still() -> None:
        server.send(b"ok")
        time.sleep(2.5)

    asyncio.get_running_loop().call_later(0.05, answered_then_stood_still)
    assert await within(conn_on(ours), answer(ours), 2.0) == b"ok"
    assert still_open(ours, server)


async def test_cancelling_the_caller_cancels_the_work_in_its_own_task(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, server = pair
    seen: list[str] = []

    async def waiting() -> bytes:
        try:
            return await answer(ours)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    caller = asyncio.create_task(within(conn_on(ours), waiting(), 5.0))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert seen == ["cancelled"]
    assert still_open(ours, server)  # a cancellation is no cut
