"""How answers leave the server's HTTP protocol: a small answer's head and body go out in one
write; a stream's head goes out even while the stream waits for its first event."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from hearth.server.protocol import BoundedHeadProtocol

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Transport(asyncio.Transport):
    """Records each write the protocol makes to its connection."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def connect(app: Any) -> tuple[BoundedHeadProtocol, Transport]:
    config = uvicorn.Config(app, lifespan="off", log_level="warning")
    protocol = BoundedHeadProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_a_small_answer_leaves_in_one_write() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    protocol, transport = connect(app)
    protocol.data_received(REQUEST)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"\r\n\r\n{}")
    protocol.connection_lost(None)


async def test_a_stream_waiting_for_its_first_event_has_sent_its_head() -> None:
    first_event = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await first_event.wait()
        await send({"type": "http.response.body", "body": b"data: 1\r\n\r\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    protocol, transport = connect(app)
    protocol.data_received(REQUEST)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 200 OK")
    first_event.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert b"".join(transport.writes[1:]) == b"b\r\ndata: 1\r\n\r\n\r\n0\r\n\r\n"
    protocol.connection_lost(None)
