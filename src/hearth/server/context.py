"""What the server hands its endpoints: the ``ServerContext`` they may use, and the ``Closing``
signal that ends open streams and long-polls when the server shuts down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from hearth.config import Settings
from hearth.runtime.runtime import Runtime

log = logging.getLogger("hearth.server")

# Where a request's scope holds the server's ``Closing`` (for the reading of its body).
CLOSING_KEY = "hearth.closing"


class Closing:
    """Set once when the server begins to shut down; readers end their answers then."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self) -> None:
        """Begin closing: set the event and call every ``on_set`` callback once."""
        if self.event.is_set():
            return
        self.event.set()
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            try:
                callback()
            except Exception:  # one that fails must not leave the others' answers open
                log.exception("a shutdown callback raised")

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when closing begins (at once if it has); returns the undo. Cheaper
        than ``watch`` for many waiters: no task each."""
        if self.event.is_set():
            callback()
            return lambda: None
        key, self._next = self._next, self._next + 1
        self._callbacks[key] = callback

        def undo() -> None:
            self._callbacks.pop(key, None)

        return undo

    def watch(self, *others: Callable[[], Awaitable[Any]]) -> asyncio.Task[None]:
        """A task done when closing begins (or when any of ``others`` returns)."""

        async def first() -> None:
            waits = [asyncio.ensure_future(self.event.wait())]
            waits += [asyncio.ensure_future(other()) for other in others]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

        return asyncio.ensure_future(first())


class ServerContext(Protocol):
    """What an endpoint may use of the server calling it (``HearthASGI`` is one)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def shutting_down(self) -> bool:
        """True from the start of a shutdown: admit nothing more."""
        ...

    @property
    def closing(self) -> Closing: ...

    @property
    def sse_heartbeat_s(self) -> float: ...

    @property
    def max_wait_s(self) -> float:
        """The longest long-poll a request may ask for (``?wait=``)."""
        ...

    @property
    def sse_streams(self) -> int:
        """How many SSE streams are open now."""
        ...

    async def runtime(self) -> Runtime:
        """The running runtime, started now if nobody started it yet."""
        ...

    def count_sse(self, delta: int) -> None:
        """Count an SSE stream opening (+1) or ending (-1)."""
        ...


Endpoint = Callable[[ServerContext, Request], Awaitable[Response]]
