"""A real HTTP/1.1 server on 127.0.0.1 that plays scripted answers, and shared fixtures.

The server runs its own asyncio loop in a background thread, so what it observes (requests,
disconnects) does not depend on the loop of the test that drives the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

try:
    import hearth.providers  # noqa: F401
except ImportError:  # running from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from hearth.errors import ProviderError
from hearth.providers.base import (
    AssistantTurn,
    ModelEvent,
    ModelRequest,
    SystemNote,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserTurn,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Answer:
    """One scripted HTTP answer."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    parts: list[bytes] = field(default_factory=list)  # each sent as one chunk
    delay: float = 0.0  # pause after each part
    head_delay: float = 0.0  # pause before the status line
    end: str = "finish"  # finish (terminating chunk) | drop (close the socket) | hang


@dataclass
class Seen:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class FakeServer:
    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.answers: deque[Answer] = deque()
        self.disconnected_at: float | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    # --- scripting ---

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sse(
        self,
        events: list[str],
        *,
        end: str = "finish",
        delay: float = 0.0,
        head_delay: float = 0.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next request with these SSE events (each a complete ``...\\n\\n`` text)."""
        self.answers.append(
            Answer(
                headers={"content-type": "text/event-stream", **(headers or {})},
                parts=[e.encode() for e in events],
                end=end,
                delay=delay,
                head_delay=head_delay,
            )
        )

    def error(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.answers.append(
            Answer(
                status=status,
                headers={"content-type": "application/json", **(headers or {})},
                parts=[body],
            )
        )

    async def wait_disconnect(self, timeout: float = 2.0) -> float:
        """Seconds from now until the client dropped the connection (fails after ``timeout``)."""
        start = time.monotonic()
        while self.disconnected_at is None:
            if time.monotonic() - start > timeout:
                raise AssertionError("the server did not see the client disconnect")
            await asyncio.sleep(0.01)
        return self.disconnected_at - start

    # --- the server ---

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(5)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # Keep-alive: serve requests on this connection until an answer ends it.
            while await self._serve_one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnected_at = time.monotonic()
        finally:
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            return False  # the client closed an idle keep-alive connection
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(Seen(method, path, headers, body))
        answer = self.answers.popleft() if self.answers else Answer(status=599)
        await asyncio.sleep(answer.head_delay)
        keep_alive = answer.end == "finish"
        lines = [f"HTTP/1.1 {answer.status} Scripted", "transfer-encoding: chunked"]
        lines += [] if keep_alive else ["connection: close"]
        lines += [f"{k}: {v}" for k, v in answer.headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        for part in answer.parts:
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(answer.delay)
        if answer.end == "finish":
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        elif answer.end == "hang":
            # Wait for the client to go away; EOF (or a reset) marks the disconnect.
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(reader.read(), timeout=10)
            self.disconnected_at = time.monotonic()
        return keep_alive


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


Collect = Callable[..., Awaitable[tuple[list[ModelEvent], ProviderError | None]]]


@pytest.fixture
def collect() -> Collect:
    """Run a provider's stream to the end: ``(events, the ProviderError raised or None)``."""

    async def run(provider: Any, request: ModelRequest) -> tuple[list[ModelEvent], Any]:
        events: list[ModelEvent] = []
        try:
            async with contextlib.aclosing(provider.stream(request)) as stream:
                async for event in stream:
                    events.append(event)
        except ProviderError as exc:
            return events, exc
        return events, None

    return run


@pytest.fixture
def hello() -> ModelRequest:
    return ModelRequest(model="m", system="Be brief.", messages=(UserTurn("hello"),))


@pytest.fixture
def conversation() -> ModelRequest:
    """Every kind of message: a tool batch with an interrupted call, a note, a summary."""
    weather = ToolSpec(
        "get_weather",
        "Look the weather up.",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    )
    return ModelRequest(
        model="m",
        system="You are helpful.",
        summary="The user lives in Oslo.",
        tools=(weather,),
        messages=(
            UserTurn("What's the weather in Oslo and Bergen?"),
            AssistantTurn(
                text="Let me check.",
                tool_calls=(
                    ToolCall("call_A1", "get_weather", {"city": "Oslo"}),
                    ToolCall("toolu_B2", "get_weather", {"city": "Bergen"}),
                ),
            ),
            ToolResult("call_A1", "get_weather", {"temp_c": 4}),
            ToolResult(
                "toolu_B2",
                "get_weather",
                {"type": "interrupted", "message": "the call was cut off; outcome unknown"},
                is_error=True,
            ),
            SystemNote("submission_interrupted", "The previous attempt crashed."),
            UserTurn("And tomorrow?"),
        ),
    )
