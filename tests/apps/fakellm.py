"""A real HTTP/1.1 server on 127.0.0.1 that plays scripted answers: the stand-in model for the
provider clients' tests. It runs its own asyncio loop in a background thread, so what it observes
(requests, disconnects) does not depend on the loop of the test that drives the client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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
        # Answers requests the queue has no answer for: SSE events computed from the request.
        self.responder: Callable[[Seen], list[str]] | None = None
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

    def respond(self, responder: Callable[[Seen], list[str]]) -> None:
        """Answer each request the queue has no answer for with the SSE events
        ``responder(request)`` returns (called on the server's thread)."""
        self.responder = responder

    def _answer(self, seen: Seen) -> Answer:
        if self.answers:
            return self.answers.popleft()
        if self.responder is not None:
            events = self.responder(seen)
            return Answer(
                headers={"content-type": "text/event-stream"}, parts=[e.encode() for e in events]
            )
        return Answer(status=599)

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
        answer = self._answer(self.requests[-1])
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
