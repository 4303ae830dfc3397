"""The soak's server processes: one ``Slot`` per ``hearth serve`` (its database, port, logs and
run counter), started ahead of time through ``hearth.testing._soak_serve``, SIGKILLed at a kill
point or from outside, and restarted. After each death of a process on its own SQLite file the
slot notes which tool outcomes and steps are on disk, as ``CrashHarness`` does, so the tools' log
can be judged run by run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hearth.testing.crash import with_store
from hearth.testing.invariants import Key, recorded_keys

APP = "hearth.testing.soak_app:app"

# Quick takeover: a restarted process reclaims its predecessor's work at once; a peer (PostgreSQL)
# finds an expired lease within a couple of seconds.
FAST_ENV = {
    "HEARTH_LEASE_S": "2",
    "HEARTH_HEARTBEAT_S": "0.5",
    "HEARTH_SCAN_S": "0.5",
    "HEARTH_SHUTDOWN_S": "5",
    "HEARTH_WORKERS": "64",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Death:
    """How one process ended."""

    run: int
    returncode: int
    planned: str | None  # the kill point it was started with
    outside: bool  # the soak SIGKILLed it (not its own kill point)


@dataclass
class Runs:
    """A run counter shared by the slots of one database (PostgreSQL: one numbering)."""

    next: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> int:
        with self.lock:
            n, self.next = self.next, self.next + 1
            return n


class Slot:
    """One ``hearth serve`` at a time on ``db``, restarted after each death."""

    def __init__(
        self, index: int, db: str, workdir: Path, runs: Runs, *, tool_log: Path, sqlite: bool
    ) -> None:
        self.index = index
        self.db = db
        self.sqlite = sqlite
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.runs = runs
        self.tool_log = tool_log
        self.trace = workdir / f"points-{index}.log"
        self.log = workdir / f"server-{index}.log"
        self.on_disk_after: dict[Key, int] = {}
        self.proc: subprocess.Popen[str] | None = None
        self.run = -1
        self.planned: str | None = None
        self.ready = threading.Event()
        self.started_at = 0.0
        self.ready_s: list[float] = []  # go → "serving" per run
        self._warm: subprocess.Popen[str] | None = None
        self._killed_outside = False
        self._trace_at = 0
        self._per_run: Counter[tuple[str, str]] = Counter()
        self._most: dict[str, int] = {}

    # --- processes ----------------------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
        env.update(FAST_ENV)
        env["HEARTH_TEST_LOG"] = str(self.tool_log)
        env["HEARTH_TRACE_POINTS"] = str(self.trace)
        with self.log.open("a") as log:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hearth.testing._soak_serve",
                    APP,
                    "--db",
                    self.db,
                    "--port",
                    str(self.port),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
            )

    def start(self, crash_at: str | None = None) -> int:
        """Start the next run (its number is returned), armed at ``crash_at`` if given."""
        proc = self._warm or self._spawn()
        self._warm = None
        self.run = self.runs.take()
        self.planned = crash_at
        self.ready.clear()
        self._killed_outside = False
        go = {"HEARTH_CRASH_RUN": str(self.run), "HEARTH_CRASH_AT": crash_at or ""}
        assert proc.stdin is not None and proc.stdout is not None
        with self.log.open("a") as log:
            log.write(f"--- run {self.run} crash_at={crash_at}\n")
        self.started_at = time.monotonic()
        proc.stdin.write(json.dumps(go) + "\n")
        proc.stdin.flush()
        self.proc = proc
        threading.Thread(target=self._watch, args=(proc.stdout,), daemon=True).start()
        return self.run

    def prewarm(self) -> None:
        """Start the process of the next run now; it waits, imported, for ``start``."""
        if self._warm is None:
            self._warm = self._spawn()

    def _watch(self, stdout: IO[str]) -> None:
        for line in stdout:
            if "serving http" in line and not self.ready.is_set():
                self.ready_s.append(time.monotonic() - self.started_at)
                self.ready.set()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self._killed_outside = True
            self.proc.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None) -> Death | None:
        """The death of the current run, or None if it still lives after ``timeout``."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return Death(self.run, code, self.planned, self._killed_outside)

    def stop(self, timeout: float = 30.0) -> Death:
        """SIGTERM (a graceful exit) and wait."""
        assert self.proc is not None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        return Death(self.run, code, self.planned, False)

    def close_warm(self) -> None:
        warm, self._warm = self._warm, None
        if warm is not None and warm.stdin is not None:
            warm.stdin.close()  # an empty line: it exits without serving
            try:
                warm.wait(30)
            except subprocess.TimeoutExpired:
                warm.kill()

    # --- bookkeeping --------------------------------------------------------------------------
    def note_on_disk(self, run: int) -> None:
        """After a death on this slot's own SQLite file: what is on disk now was there after
        ``run`` at the latest."""
        if not self.sqlite:
            return
        for key in asyncio.run(with_store(self.db, recorded_keys)):
            self.on_disk_after.setdefault(key, run)

    def points_seen(self) -> dict[str, int]:
        """Each kill point reached by this slot's processes, with the most times one run
        reached it (the trace is read on from where the last call stopped)."""
        if self.trace.exists():
            with self.trace.open() as f:
                f.seek(self._trace_at)
                text = f.read()
            done = text.rfind("\n") + 1
            self._trace_at += done
            for line in text[:done].splitlines():
                run, _, point = line.partition("|")
                self._per_run[(run, point)] += 1
                self._most[point] = max(self._most.get(point, 0), self._per_run[(run, point)])
        return dict(self._most)
