"""A crash harness on a fresh database, plus the log of tool and step executions.

The crash apps log each run with ``ran(what, ctx)`` as ``what|conversation|tool_call_id|run``
(``run`` is the harness's ``HEARTH_CRASH_RUN``): ``what`` is the tool's name (an ordinary call),
``<tool>-start`` (a durable tool's body), ``step-<name>`` (a step's body) or anything else for
lines the invariant checker does not judge (``hook``); see ``hearth.testing.toollog``."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hearth.testing import CrashHarness
from hearth.testing.invariants import ToolRun
from hearth.testing.toollog import points_reached, tool_runs

APPS = Path(__file__).resolve().parent


@dataclass
class Snapshot:
    """A lab between two runs: its files and its harness's bookkeeping."""

    directory: Path
    log: str
    runs: int
    kills: int
    on_disk_after: dict[tuple[str, str, str | None], int]


class Lab:
    """A crash harness on a fresh database, plus the log of tool and step executions."""

    def __init__(self, tmp_path: Path, app: str = "crashapp:app") -> None:
        self.tmp_path = tmp_path
        self.log = tmp_path / "ran.log"
        self.trace = tmp_path / "points.log"
        self.harness = CrashHarness(
            app,
            db=tmp_path / "hearth.db",
            env={
                "HEARTH_TEST_LOG": str(self.log),
                "HEARTH_TRACE_POINTS": str(self.trace),
                "HEARTH_LEASE_S": "5",
                "HEARTH_HEARTBEAT_S": "1",
                "HEARTH_SCAN_S": "1",
            },
            pythonpath=[APPS],
        )

    def lines(self) -> list[list[str]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [line.split("|") for line in text.splitlines()]

    def ran(self) -> list[str]:
        """What ran, in order (tool names, ``<tool>-start``, ``step-<name>``, ``hook``)."""
        return [fields[0] for fields in self.lines()]

    def count(self, what: str) -> int:
        return self.ran().count(what)

    def tool_runs(self) -> list[ToolRun]:
        return tool_runs(self.log)

    def assert_invariants(self) -> None:
        """The invariant checker over the database and this lab's tool log."""
        self.harness.assert_invariants(self.tool_runs())

    def reached(self, run: int) -> Counter[str]:
        """How often each crash point was reached in that run (apps that ``trace_points``)."""
        return points_reached(self.trace, run)

    # --- rolling a run back (no process is running) --------------------------------------
    def snapshot(self) -> Snapshot:
        keep = self.tmp_path / f"snapshot-{self.harness.runs}"
        keep.mkdir()
        for f in self.tmp_path.glob("hearth.db*"):
            shutil.copy2(f, keep / f.name)
        log = self.log.read_text() if self.log.exists() else ""
        h = self.harness
        return Snapshot(keep, log, h.runs, h.kills, dict(h.on_disk_after))

    def restore(self, snap: Snapshot) -> None:
        """Undo the runs since ``snap``, except the trace of what they reached."""
        for f in self.tmp_path.glob("hearth.db*"):
            f.unlink()
        for f in snap.directory.iterdir():
            shutil.copy2(f, self.tmp_path / f.name)
        self.log.write_text(snap.log)
        h = self.harness
        h.kills, h.on_disk_after = snap.kills, dict(snap.on_disk_after)
        # ``runs`` keeps counting, so that each run's trace and tool log lines stay its own
