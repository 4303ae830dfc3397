"""uvicorn's httptools protocol with a deadline and a size bound for a request's head.

uvicorn closes a connection that stays idle between requests (``timeout_keep_alive``), but a
client that sends part of a request head and then stalls (slowloris) keeps its connection, and
its file descriptor, for as long as it likes. Here the head of each request must be complete
within ``HEAD_TIMEOUT_S`` of its first byte (or of the connection); past that the connection is
closed. Each stalled connection costs the event loop nothing while it waits, so the deadline is
what bounds how many of them can pile up.

The httptools parser (C) costs a quarter less CPU per request than h11 (pure Python), but unlike
h11 it puts no bound on a head's size: a head past ``MAX_HEAD_BYTES`` is answered 431 and its
connection closed, once the answers to the requests pipelined before it have gone out. Only the
head's own bytes count: a read that also carries earlier requests (pipelined) counts for the
request line and the headers the parser completed in it, and each later read whole.

uvicorn writes an answer's status line and headers, then its body, as two writes: two ``send``
system calls and two packets for a small JSON answer. Each response here holds its head until its
first body write (or the end of the event loop's turn, for a stream that waits before its first
event), so a small answer leaves in one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEAD_TIMEOUT_S = 10.0
# In each request's scope: drops its connection at once (a stream whose client stopped reading
# ends so, where a clean end would wait for that client to read).
ABORT_KEY = "hearth.abort_connection"
MAX_HEAD_BYTES = 64 * 1024  # request line and headers together

_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: 31\r\n\r\n"
    b"the request head is too large\r\n"
)


class BoundedHeadProtocol(HttpToolsProtocol):
    """An ``HttpToolsProtocol`` that closes a connection whose request head is not complete in
    time, and refuses a head larger than ``max_head_bytes``."""

    head_timeout_s = HEAD_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES
    _head_timer: asyncio.TimerHandle | None = None
    _in_head = False  # between the first byte of a request and the end of its head
    _head_bytes = 0  # of the reads that were all head
    _head_parsed = 0  # of the request line and headers parsed so far
    _head_began = False  # (in the read being parsed)
    _refused = False  # a head too large: 431 once the answers before it are out

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._open_cycles: list[Any] = []  # its requests whose answers may still be going out
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # nothing more is read from a connection that is being refused
        self._head_began = False
        super().data_received(data)
        if not self._in_head:
            return
        if not self._head_began:
            self._head_bytes += len(data)  # a head that began in an earlier read: all of it
        size = max(self._head_bytes, self._head_parsed)
        if size > self.max_head_bytes and not self.transport.is_closing():
            self._refuse()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_parsed = True, 0, 0
        self._head_began = True
        if self._head_timer is None:
            self._arm()  # the first bytes of the next request on a kept-alive connection

    def on_url(self, url: bytes) -> None:
        self._head_parsed += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_parsed += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refused and not self._answers_pending() and not self.transport.is_closing():
            self.transport.write(_TOO_LARGE)
            self.transport.close()

    def _refuse(self) -> None:
        """Answer 431 and close, after the answers to the requests before this head."""
        self._disarm()
        self._refused = True
        if not self._answers_pending():
            self.transport.write(_TOO_LARGE)
            self.transport.close()

    def _answers_pending(self) -> bool:
        cycle = self.cycle
        return bool(self.pipeline) or (cycle is not None and not cycle.response_complete)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()  # the head is in: the body and the answer have their own limits
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = _HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
        if cycle is not None:
            self._open_cycles = [c for c in self._open_cycles if not c.response_complete]
            self._open_cycles.append(cycle)
            cycle.scope[ABORT_KEY] = self.transport.abort  # type: ignore[literal-required]

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        # uvicorn tells only the newest request that its client went away: with two requests
        # pipelined on one connection, an earlier one still streaming (an SSE follower) wrote
        # into the closed connection for ever, holding its stream's slot.
        for cycle in self._open_cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.message_event.set()
        self._open_cycles = []

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()  # armed only while no complete head has arrived


class _HeadWithBody:
    """One response's view of its connection: the first write (the status line and headers) is
    held until the next write, which carries it along, or until the loop's next turn."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._written = False

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        elif not self._written:
            self._written = True
            self._held = data
            self._loop.call_soon(self._flush)
            return
        self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
