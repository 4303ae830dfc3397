"""A crash harness on a fresh database, plus the log of tool and step executions."""

from __future__ import annotations

from pathlib import Path

from hearth.testing import CrashHarness

APPS = Path(__file__).resolve().parent


class Lab:
    """A crash harness on a fresh database, plus the log of tool and step executions."""

    def __init__(self, tmp_path: Path, app: str = "crashapp:app") -> None:
        self.log = tmp_path / "ran.log"
        self.harness = CrashHarness(
            app,
            db=tmp_path / "hearth.db",
            env={
                "HEARTH_TEST_LOG": str(self.log),
                "HEARTH_LEASE_S": "5",
                "HEARTH_HEARTBEAT_S": "1",
                "HEARTH_SCAN_S": "1",
            },
            pythonpath=[APPS],
        )

    def ran(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def count(self, what: str) -> int:
        return self.ran().count(what)
