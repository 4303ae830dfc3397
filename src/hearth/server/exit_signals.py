"""Hearing the ASGI server's exit signals from inside the app.

uvicorn waits for open connections to close before it runs the lifespan shutdown, and only the
app can end its SSE streams and long-polls: one follower held a SIGTERM for as long as the
server's graceful timeout (for ever, by default). An ASGI app is told nothing until then, so the
handler the server installed for SIGTERM and SIGINT is wrapped: hearth hears the signal, then the
server does, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from types import FrameType

EXIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
Handler = Callable[[int, FrameType | None], object]


def on_exit_signals(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` on the running loop when SIGINT or SIGTERM arrives, before the handler
    the server installed; returns the function that undoes it. Nothing is wrapped off the main
    thread (no handler can be set there) nor where the server set no Python handler (the
    default ends the process at once; an ignored signal means no shutdown)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    wrapped: dict[int, tuple[Handler, Handler]] = {}
    for sig in EXIT_SIGNALS:
        previous = signal.getsignal(sig)
        if not callable(previous) or previous is signal.default_int_handler:
            continue
        handler = _heard_first(loop, callback, previous)
        signal.signal(sig, handler)
        wrapped[sig] = (handler, previous)

    def undo() -> None:
        for sig, (handler, previous) in wrapped.items():
            if signal.getsignal(sig) is handler:  # (else the server has put back its own)
                signal.signal(sig, previous)

    return undo


def _heard_first(
    loop: asyncio.AbstractEventLoop, callback: Callable[[], None], previous: Handler
) -> Handler:
    def handler(signum: int, frame: FrameType | None) -> object:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing left to end
            loop.call_soon_threadsafe(callback)
        return previous(signum, frame)

    return handler
