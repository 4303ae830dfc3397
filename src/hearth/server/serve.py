"""Running the ASGI app under uvicorn, with hearth's graceful shutdown.

On SIGTERM or SIGINT: new admissions get 503 at once, open SSE streams and long-polls end
cleanly, running work is interrupted and its leases released (the next process resumes it), and
the process exits within ``HEARTH_SHUTDOWN_S`` — past that, it exits anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

import uvicorn

from hearth import logs
from hearth.server.asgi import DEFAULT_HEARTBEAT_S, HearthASGI
from hearth.server.errors import ApiError
from hearth.server.host import RuntimeHost
from hearth.server.protocol import BoundedHeadProtocol

log = logging.getLogger("hearth.server")


class HearthServer(uvicorn.Server):
    """A uvicorn server that starts hearth's shutdown the moment a signal arrives."""

    def __init__(
        self, config: uvicorn.Config, asgi: HearthASGI, shutdown_s: float, *, hard_exit: bool
    ) -> None:
        super().__init__(config)
        self.asgi = asgi
        self.shutdown_s = shutdown_s
        self.hard_exit = hard_exit  # past shutdown_s, end the process (never in tests)
        self.on_ready: Callable[[str], None] = lambda url: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: threading.Timer | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        if self.started:
            self.on_ready(self.url)

    @property
    def url(self) -> str:
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                if ":" in host:
                    host = f"[{host}]"
                return f"http://{host}:{port}"
        return f"http://{self.config.host}:{self.config.port}"

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        if not first and sig == signal.SIGINT and self.hard_exit:
            # Ctrl-C again while stopping: the wait is cut short, as docs/http.md says (the
            # server would only skip its lifespan's end, and go on waiting for a sync tool).
            _exit_now(130, INTERRUPTED)
        super().handle_exit(sig, frame)
        # A graceful shutdown ends with a normal exit, not by re-raising the signal.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()
        if first:
            self.begin_shutdown()

    def begin_shutdown(self) -> None:
        """Start hearth's side of the shutdown now, from any thread or a signal handler."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.asgi.begin_shutdown)
        self.should_exit = True
        if self.hard_exit and self._watchdog is None:
            self._watchdog = threading.Timer(self.shutdown_s, _overrun, (self.shutdown_s,))
            self._watchdog.daemon = True
            self._watchdog.start()

    def cancel_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()


INTERRUPTED = "hearth: interrupted; exiting now"  # Ctrl-C again while stopping


def _overrun(limit: float) -> None:
    _exit_now(1, f"hearth: graceful shutdown took over {limit:g} s; exiting now")


def _exit_now(status: int, why: str) -> NoReturn:
    """End the process at once, whatever threads still run, after saying why."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.write(why + "\n")
        sys.stderr.flush()
    os._exit(status)


def make_server(
    app: RuntimeHost,
    *,
    log_level: str = "warning",
    access_log: bool = False,
    sse_heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    hard_exit: bool = False,
) -> HearthServer:
    """A server for ``app`` on ``app.settings.host``/``port`` (port 0: any free port)."""
    settings = app.settings
    asgi = HearthASGI(app, sse_heartbeat_s=sse_heartbeat_s)
    log_config = logs.configure(settings.log_format, log_level)
    extra: dict[str, Any] = {} if log_config is None else {"log_config": log_config}
    config = uvicorn.Config(
        asgi,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        # Connections get most of the budget; stopping the runtime runs alongside them.
        timeout_graceful_shutdown=max(int(settings.shutdown_s * 0.8), 1),
        timeout_keep_alive=5,
        server_header=False,
        http=BoundedHeadProtocol,  # a stalled or endless request head cannot hold its connection
        **extra,
    )
    logs.redact(settings.token)  # uvicorn's handlers exist now (made by Config)
    if access_log:
        # uvicorn set its access logger to ``log_level`` too: at the default (warning) the
        # lines ``--access-log`` asks for, logged at info, were all dropped.
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    return HearthServer(config, asgi, settings.shutdown_s, hard_exit=hard_exit)


async def serve_async(server: HearthServer, sockets: list[socket.socket] | None = None) -> None:
    """Start the runtime (errors surface here, before any socket is bound), then serve (on
    ``sockets`` when given: bound already, by ``hearth serve --reload``'s watching process)."""
    try:
        await server.asgi.runtime()
    except ApiError as exc:
        raise (exc.__cause__ or exc) from None
    gc.freeze()  # what start-up made lives on: keep it out of every later collection
    try:
        await server.serve(sockets)
    finally:
        await server.asgi.stop()


def serve(
    app: RuntimeHost,
    *,
    log_level: str = "warning",
    access_log: bool = False,
    on_ready: Callable[[str], None] | None = None,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve ``app`` until SIGTERM/SIGINT (what ``hearth serve`` runs)."""
    server = make_server(app, log_level=log_level, access_log=access_log, hard_exit=True)
    if on_ready is not None:
        server.on_ready = on_ready
    try:
        asyncio.run(serve_async(server, sockets))
    except KeyboardInterrupt:
        # Interrupted again while stopping (Ctrl-C twice): the exit would wait for a sync
        # tool's thread, for as long as the tool runs.
        _exit_now(130, INTERRUPTED)
    # The watchdog outlives the loop (closing it waits for the worker threads, and a sync tool's
    # thread, which no shutdown can interrupt, held the process for as long as the tool ran),
    # and a failure: the interpreter's exit waits for those threads too.
    server.cancel_watchdog()
