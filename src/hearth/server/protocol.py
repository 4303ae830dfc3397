"""uvicorn's h11 protocol with a deadline for a request's head.

uvicorn closes a connection that stays idle between requests (``timeout_keep_alive``), but a
client that sends part of a request head and then stalls (slowloris) keeps its connection, and
its file descriptor, for as long as it likes. Here the head of each request must be complete
within ``HEAD_TIMEOUT_S`` of its first byte (or of the connection); past that the connection is
closed. Each stalled connection costs the event loop nothing while it waits, so the deadline is
what bounds how many of them can pile up.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0


class HeadTimeoutH11Protocol(H11Protocol):
    """An ``H11Protocol`` that closes a connection whose request head is not complete in time."""

    head_timeout_s = HEAD_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the head is in: the body and the answer have their own limits

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
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
