"""uvicorn's httptools protocol with a deadline and a size bound for a request's head.

uvicorn closes a connection that stays idle between requests (``timeout_keep_alive``), but a
client that sends part of a request head and then stalls (slowloris) keeps its connection, and
its file descriptor, for as long as it likes. Here the head of each request must be complete
within ``HEAD_TIMEOUT_S`` of its first byte (or of the connection); past that the connection is
closed. Each stalled connection costs the event loop nothing while it waits, so the deadline is
what bounds how many of them can pile up.

The httptools parser (C) costs a quarter less CPU per request than h11 (pure Python), but unlike
h11 it puts no bound on a head's size: a head past ``MAX_HEAD_BYTES`` is answered 431 and its
connection closed.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEAD_TIMEOUT_S = 10.0
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
    _head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head:
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
            self._disarm()
            self.transport.write(_TOO_LARGE)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        if self._head_timer is None:
            self._arm()  # the first bytes of the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()  # the head is in: the body and the answer have their own limits
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

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
