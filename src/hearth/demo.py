"""``hearth demo``: kill a real server in the middle of a durable tool and watch it recover.

It starts ``hearth serve hearth.demo_app:app`` as a child process on a SQLite file in a fresh
temporary folder, sends one message through the SDK and follows the conversation's SSE stream.
When the durable tool has recorded its first step and sleeps before its second, while the
ordinary tool is still running, the server is SIGKILLed and started again on the same database.
The same SDK stream reconnects and shows the rest: step 1 is not run again, the cut-off ordinary
call gets an ``interrupted`` outcome, and the submission settles once.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.markup import escape

from hearth.client import Client
from hearth.errors import HearthError

AGENT, ID = "shop", "order-1"
STEP_1, STEP_2 = "expensive_calculation", "save"


class DemoError(HearthError):
    """The demo could not run (the server did not start, or the stream went quiet)."""


class DemoServer:
    """``hearth serve hearth.demo_app:app`` as a child process on a fixed loopback port."""

    def __init__(self, folder: Path, db_url: str, port: int) -> None:
        self.folder = folder
        self.db_url = db_url
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[str] | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
        self.env["HEARTH_DEMO_DIR"] = str(folder)

    @property
    def command(self) -> list[str]:
        return [
            "hearth",
            "serve",
            "hearth.demo_app:app",
            "--db",
            self.db_url,
            "--port",
            str(self.port),
        ]

    def start(self, timeout: float = 20.0) -> None:
        log = (self.folder / "server.log").open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hearth", *self.command[1:], "--host", "127.0.0.1"],
            stdout=subprocess.PIPE,
            stderr=log,
            env=self.env,
            text=True,
        )
        log.close()
        assert self.proc.stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, lines), daemon=True).start()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                break
            if "serving http" in line:
                return
        self.kill()
        tail = (self.folder / "server.log").read_text()[-2000:].strip()
        raise DemoError(f"the demo server did not start: {tail or 'no output'}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def runs(folder: Path, step: str) -> int:
    path = folder / f"runs-{step}.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def explain(record: dict[str, Any], folder: Path) -> str:
    """One line saying what a record means, for a newcomer."""
    kind, name = record.get("type"), record.get("name")
    if kind == "conversation_created":
        return "the conversation exists from its first admission"
    if kind == "user_message":
        return "your message, stored durably before the server answered 202"
    if kind == "assistant_message_started":
        return "the (scripted) model starts its reply"
    if kind == "assistant_text_delta":
        return f"its text, persisted as it streams: {record.get('delta')!r}"
    if kind == "assistant_tool_call":
        if name == "place_order":
            return "it calls place_order: a durable tool with two steps"
        return f"…and, in parallel, {name}: an ordinary (non-durable) tool"
    if kind == "assistant_message_completed":
        if record.get("stop_reason") == "tool_use":
            return "the model's message is complete; both tools start running"
        return "the model's final answer is complete"
    if kind == "tool_step_settled":
        n = runs(folder, STEP_1)
        if record.get("step") == STEP_1:
            return f"step 1 ({STEP_1}) recorded its value {record.get('value')}; it ran {n}×"
        return f"step 2 ({STEP_2}) ran; step 1 was replayed from its record (still ran {n}×)"
    if kind == "tool_outcome":
        content = record.get("content")
        if (
            record.get("is_error")
            and isinstance(content, dict)
            and content.get("type") == "interrupted"
        ):
            return f"{name} was cut off by the crash: its outcome is unknown, so it is not re-run"
        return f"{name} finished: {content}"
    if kind == "tool_results_committed":
        return "the tool batch is closed; the model reads the outcomes next"
    if kind == "signal":
        return f"a note for the model: {record.get('signal_type')}"
    if kind == "submission_settled":
        return f"the submission settled {record.get('outcome')} — once"
    return ""


def run_demo(console: Console) -> int:
    """Run the demo; the exit status is 0 when every check held."""
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="hearth-demo-"))
    db_url = f"sqlite:///{folder / 'hearth.db'}"
    server = DemoServer(folder, db_url, free_port())

    def say(text: str) -> None:
        console.print(text, soft_wrap=True)

    say(
        "[bold]hearth demo[/bold]: a server is killed in the middle of a tool call, and recovers.\n"
    )
    say(f"database: {folder / 'hearth.db'}")
    try:
        with console.status("starting hearth serve…"):
            server.start()
        say(f"server:   {server.url} (pid {_pid(server)})\n")
        with Client(server.url) as client:
            conv = client.conversation(AGENT, ID)
            receipt = conv.send("Please order a teapot.")
            say(f"sent a message: 202, submission {receipt.submission_id}\n")
            killed_at = None
            for record in conv.stream(-1):
                say(_line(record, folder))
                if (
                    killed_at is None
                    and record["type"] == "tool_step_settled"
                    and record.get("step") == STEP_1
                ):
                    killed_at = record["offset"]
                    server.kill()
                    say(
                        "\n[bold red]💥 SIGKILL[/bold red] the server: place_order sleeps before"
                        " step 2 and check_stock is still running"
                    )
                    with console.status("restarting hearth serve on the same database…"):
                        server.start()
                    say(
                        f"[bold green]↻ restarted[/bold green] (pid {_pid(server)}); the SDK's"
                        f" stream reconnects and resumes after offset {killed_at}\n"
                    )
                if (
                    record["type"] == "submission_settled"
                    and record.get("submission_id") == receipt.submission_id
                ):
                    break
            reply = conv.read(receipt, timeout=10)
            history = conv.history()
            status = conv.submission(receipt.submission_id)
        say(f"\nreply: [bold]{escape(reply.text)}[/bold]\n")
        ok = _checks(console, folder, history, receipt.submission_id, status)
    finally:
        server.stop()
    elapsed = time.monotonic() - started
    say(f"\nfinished in {elapsed:.1f} s; the database stays at {folder / 'hearth.db'}")
    say("to look at it again, serve it and tail the conversation (two terminals):")
    say(f"  {' '.join(server.command)}")
    say(f"  hearth tail {AGENT} {ID} --url {server.url}")
    return 0 if ok else 1


def _pid(server: DemoServer) -> str:
    return str(server.proc.pid) if server.proc is not None else "?"


def _line(record: dict[str, Any], folder: Path) -> str:
    attempt = record.get("attempt")
    where = f"attempt {attempt}" if attempt else ""
    return (
        f"[dim]{record['offset']:>3} {where:<9}[/dim] [cyan]{record['type']:<28}[/cyan]"
        f" {escape(explain(record, folder))}"
    )


def _checks(
    console: Console, folder: Path, history: list[dict[str, Any]], sid: str, status: dict[str, Any]
) -> bool:
    settlements = [
        r for r in history if r["type"] == "submission_settled" and r.get("submission_id") == sid
    ]
    interrupted = [
        r
        for r in history
        if r["type"] == "tool_outcome"
        and r.get("name") == "check_stock"
        and r.get("is_error")
        and isinstance(r.get("content"), dict)
        and r["content"].get("type") == "interrupted"
    ]
    checks = [
        (
            runs(folder, STEP_1) == 1,
            f"step 1 ran once across the crash (runs: {runs(folder, STEP_1)})",
        ),
        (bool(interrupted), "the cut-off check_stock call got an 'interrupted' error outcome"),
        (
            len(settlements) == 1,
            f"the submission settled exactly once ({len(settlements)} settlement)",
        ),
        (
            status.get("outcome") == "completed",
            f"its outcome is {status.get('outcome')}, on attempt {status.get('attempt')}",
        ),
    ]
    for passed, text in checks:
        mark = "[green]✓[/green]" if passed else "[red]✗[/red]"
        console.print(f"{mark} {escape(text)}")
    return all(passed for passed, _ in checks)
