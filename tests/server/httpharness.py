"""Real servers for the HTTP tests: uvicorn in a thread of this process, or ``hearth serve`` in a
child process (for SIGKILL and SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx2
import serverapp

import hearth
from hearth.server.serve import HearthServer, make_server, serve_async

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def make_app(db: Path | str, **settings: Any) -> hearth.App:
    settings.setdefault("port", 0)
    return hearth.App(serverapp.AGENTS, db=str(db), providers=serverapp.MODELS, **settings)


class ThreadServer:
    """uvicorn + hearth on a free loopback port, in a thread with its own event loop."""

    def __init__(self, app: hearth.App, *, sse_heartbeat_s: float = 15.0) -> None:
        self.app = app
        self.server: HearthServer = make_server(app, sse_heartbeat_s=sse_heartbeat_s)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            await serve_async(self.server)

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by start()
            self.error = exc

    def start(self) -> ThreadServer:
        self.thread.start()
        end = time.monotonic() + 15
        while not self.server.started:
            if self.error is not None or not self.thread.is_alive():
                raise RuntimeError(f"the server did not start: {self.error!r}")
            if time.monotonic() > end:
                raise TimeoutError("the server did not start in 15 s")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def asgi(self) -> Any:
        return self.server.asgi

    def damage_record(self, conversation_id: str, offset: int) -> None:
        """Make the body of one record unreadable, on the server's own connection (as data
        changed outside hearth, or damaged on disk)."""
        store = self.asgi._runtime.store

        def damage(conn: Any, _: Any) -> None:
            conn.execute(
                "UPDATE records SET body = '{' WHERE conversation_id = ? AND \"offset\" = ?",
                (conversation_id, offset),
            )

        assert self.loop is not None
        running = store._writer.call(damage, write=True)
        asyncio.run_coroutine_threadsafe(running, self.loop).result(timeout=10)

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the server's loop."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float = 20.0) -> None:
        if self.thread.is_alive():
            self.server.begin_shutdown()
            self.thread.join(timeout)
            assert not self.thread.is_alive(), "the server did not stop"

    def client(self, **kwargs: Any) -> httpx2.Client:
        return httpx2.Client(base_url=self.url, timeout=10.0, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
    paths = [str(HERE), str(SRC), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env


class ServerProcess:
    """``python -m hearth serve serverapp:app`` on one database and one port, restartable.

    ``db`` is a SQLite file (its log goes next to it) or a database URL (give ``log``).
    """

    def __init__(
        self,
        db: Path | str,
        port: int | None = None,
        *,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        app: str = "serverapp:app",
        log: Path | None = None,
    ) -> None:
        self.db = db
        self.db_url = f"sqlite:///{db}" if isinstance(db, Path) else db
        self.app = app
        self.port = port or free_port()
        self.env = child_env(**(env or {}))
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.url = f"http://127.0.0.1:{self.port}"
        if log is None:
            assert isinstance(db, Path), "give a log file with a database URL"
            log = db.parent / "server.log"
        self.log = log
        self.ready_line = ""
        self.before_ready: list[str] = []  # what it printed on stdout before its ready line

    def start(self, timeout: float = 20.0) -> ServerProcess:
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hearth",
                    "serve",
                    self.app,
                    "--db",
                    self.db_url,
                    "--port",
                    str(self.port),
                    *self.args,
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
                text=True,
            )
        assert self.proc.stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()
        self._out = lines
        threading.Thread(target=_pump, args=(self.proc.stdout, lines), daemon=True).start()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = lines.get(timeout=0.05)
            except queue.Empty:
                continue
            if line is None:
                break
            if "serving http" in line:
                self.ready_line = line.strip()
                return self
            self.before_ready.append(line.strip())
        self.kill()
        raise RuntimeError(f"hearth serve did not start:\n{self.log.read_text()[-3000:]}")

    def printed(self) -> str:
        """What the server printed on stdout after its ready line (so far)."""
        out = []
        with contextlib.suppress(queue.Empty):
            while (line := self._out.get_nowait()) is not None:
                out.append(line)
        return "".join(out)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def sse_records(response: httpx2.Response) -> Any:
    """Parse an SSE response into (id, record) pairs, as they arrive."""
    import json

    event_id, data = None, []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield event_id, json.loads("\n".join(data))
            event_id, data = None, []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.02) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError("condition not met in time")
        time.sleep(step)


@contextlib.contextmanager
def answering(status: int, error_type: str, message: str) -> Iterator[str]:
    """The URL of a loopback server that answers every GET ``status`` with hearth's error
    envelope of ``error_type`` (a server failing, or one whose database is away)."""
    body = json.dumps({"error": {"type": error_type, "message": message, "details": None}})

    class Fixed(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fixed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
