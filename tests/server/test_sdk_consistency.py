"""The SDK behaves as the Python API does: the same answers for the same calls, the same
``hearth.errors`` classes for the same faults (against a real server)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from httpharness import ThreadServer, answering

import hearth
from hearth.client import ServerUnavailable
from hearth.errors import ChannelFailed, CorruptData, DeliveryNotFound, InvalidInput, UnknownChannel


def _verify(headers: dict[str, str], body: bytes) -> hearth.Delivery:
    data = json.loads(body or b"{}")
    return hearth.Delivery(headers.get("x-delivery-id", "d1"), "message", data, time.time())


def _receive(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
    if delivery.data.get("boom"):
        raise RuntimeError("boom")
    return [hearth.Dispatch("echo", "from-hook", message="hi")]


@pytest.fixture
def hooked(serve_app: Callable[..., ThreadServer]) -> ThreadServer:
    """A server with a channel ``hook`` whose delivery ``bad`` has failed (its receive raised)."""
    server = serve_app(channels=[hearth.Channel("hook", verify=_verify, receive=_receive)])
    with server.client() as http:
        sent = http.post("/channels/hook", json={"boom": True}, headers={"x-delivery-id": "bad"})
        assert sent.status_code == 500
    return server


@pytest.fixture
def faulty_server() -> Iterator[str]:
    """A loopback server that answers every request 500 ``internal`` (a fault of its own)."""

    with answering(500, "internal", "the server failed; see its log") as url:
        yield url


@pytest.mark.anyio
async def test_a_read_with_no_time_left_still_asks_once(server: ThreadServer) -> None:
    """``read(receipt, timeout=0)`` raised TimeoutError before any request, even for a
    submission long settled; ``Runtime.read`` reads the row once and returns the reply."""
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        receipt = conv.send("hello")
        reply = conv.read(receipt, timeout=10)
        assert conv.read(receipt, timeout=0) == reply
        stalled = client.conversation("staller", "c-1")
        with pytest.raises(TimeoutError, match="has not settled yet"):
            stalled.read(stalled.send("hi"), timeout=0)
    async with hearth.AsyncClient(server.url) as aclient:
        aconv = aclient.conversation("echo", "c-1")
        assert await aconv.read(receipt, timeout=0) == reply
        astalled = aclient.conversation("staller", "c-2")
        with pytest.raises(TimeoutError, match="has not settled yet"):
            await astalled.read(await astalled.send("hi"), timeout=0)


def test_channel_errors_come_back_as_the_python_apis_classes(hooked: ThreadServer) -> None:
    """They came back as HTTPError, and a failing replay as ServerUnavailable (which read and
    stream take for a server away)."""
    with hearth.Client(hooked.url) as client:
        with pytest.raises(UnknownChannel):
            client.deliveries("nope")
        with pytest.raises(DeliveryNotFound):
            client.replay("hook", "zzz")
        with pytest.raises(ChannelFailed) as failed:
            client.replay("hook", "bad")
    assert (failed.value.channel, failed.value.delivery_id) == ("hook", "bad")
    assert failed.value.status == 500  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_refused_request_is_invalid_input_naming_its_field(server: ThreadServer) -> None:
    with hearth.Client(server.url) as client:
        with pytest.raises(InvalidInput) as refused:
            client.conversation("echo", "c-1").send("")
    assert refused.value.field == "message"
    assert refused.value.status == 400  # type: ignore[attr-defined]
    async with hearth.AsyncClient(server.url) as aclient:
        with pytest.raises(InvalidInput):
            await aclient.conversation("echo", "c-1").send("")


@pytest.mark.anyio
async def test_data_the_server_cannot_read_is_corrupt_data_and_not_retried(
    server: ThreadServer,
) -> None:
    """A 500 ``corrupt_data`` came back as ServerUnavailable, so ``stream`` reconnected for
    ever to be answered the same."""
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        conv.read(conv.send("hello"), timeout=10)
        server.damage_record("echo/c-1", 1)
        with pytest.raises(CorruptData, match="a record of echo/c-1 cannot be read"):
            conv.history()
    async with hearth.AsyncClient(server.url) as aclient:
        records = aclient.conversation("echo", "c-1").stream(offset=0)
        with pytest.raises(CorruptData):
            await asyncio.wait_for(anext(records), 10)  # (TimeoutError: retried)


@pytest.mark.anyio
async def test_a_fault_of_the_servers_own_is_not_retried(faulty_server: str) -> None:
    """A 500 ``internal`` was taken for a server away: ``read`` and ``stream`` retried it until
    their timeout, or for ever."""
    with hearth.Client(faulty_server) as client:
        with pytest.raises(ServerUnavailable) as failed:
            client.conversation("echo", "c-1").read("s_1", timeout=10)
    assert failed.value.type == "internal"
    async with hearth.AsyncClient(faulty_server) as aclient:
        records = aclient.conversation("echo", "c-1").stream()
        with pytest.raises(ServerUnavailable):
            await asyncio.wait_for(anext(records), 10)  # (TimeoutError: retried)


NOT_SENDABLE: list[tuple[str, Callable[[Any], Any]]] = [
    ("value", lambda conv: conv.resolve("w_000000000000000000000000", float("nan"))),
    ("value", lambda conv: conv.resolve("w_000000000000000000000000", {1, 2})),
    ("value", lambda conv: conv.resolve("w_000000000000000000000000", ["a\ud83d"])),
    ("signal.attributes", lambda conv: conv.signal("n", attributes={"x": float("nan")})),
    ("signal.attributes", lambda conv: conv.signal("n", attributes={"k\udc00": 1})),
    ("signal.body", lambda conv: conv.signal("n", "b\ud83d")),
    ("message", lambda conv: conv.send("a\ud83db")),
    ("idempotency_key", lambda conv: conv.send("hi", idempotency_key="k\ud83d")),
    ("idempotency_key", lambda conv: conv.signal("n", idempotency_key="k\ud83d")),
    ("new_id", lambda conv: conv.fork(0, "f\ud83d")),
]


@pytest.mark.parametrize(("field", "call"), NOT_SENDABLE)
@pytest.mark.anyio
async def test_input_no_json_body_can_carry_is_invalid_input_naming_its_field(
    server: ThreadServer, field: str, call: Callable[[Any], Any]
) -> None:
    """NaN, a set or half a surrogate pair escaped from httpx2 as ValueError, TypeError or
    UnicodeEncodeError; the Python API refuses each as InvalidInput."""
    with hearth.Client(server.url) as client:
        with pytest.raises(InvalidInput) as refused:
            call(client.conversation("echo", "c-1"))
    assert refused.value.field == field
    # What a server's 400 carries too (its status None: no request was made).
    error: Any = refused.value
    assert (error.status, error.type, error.details) == (None, "invalid_request", {"field": field})
    assert error.message == str(error)
    async with hearth.AsyncClient(server.url) as aclient:
        with pytest.raises(InvalidInput) as refused:
            await call(aclient.conversation("echo", "c-1"))
    assert refused.value.field == field


def test_a_path_part_no_url_can_carry_is_invalid_input(server: ThreadServer) -> None:
    """Half a surrogate pair in an id raised UnicodeEncodeError from ``quote``; the Python API
    refuses such an id with one of its own errors."""
    with hearth.Client(server.url) as client:
        with pytest.raises(InvalidInput, match="no URL can carry it"):
            client.conversation("echo", "half \ud83d").send("hi")
        with pytest.raises(InvalidInput, match="no URL can carry it"):
            client.conversation("echo", "c-1").resolve("w\udc00", True)
