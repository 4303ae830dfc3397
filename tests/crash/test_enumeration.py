"""The kill-point enumeration (``python -m hearth.testing.enumerate``), run as the command it is:
its short form kills a real process once at every point some scenario reaches, and every case
passes; and a kill planned where the scenario never goes is reported as a failed case."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from hearth.testing import KILL_POINTS
from hearth.testing.scenarios import UNREACHED


def enumerate_cases(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hearth.testing.enumerate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def totals(stdout: str) -> tuple[int, int, int]:
    found = re.fullmatch(r"cases: (\d+), passed: (\d+), failed: (\d+)", stdout.splitlines()[-1])
    assert found is not None, stdout[-2000:]
    cases, passed, failed = (int(g) for g in found.groups())
    return cases, passed, failed


@pytest.mark.crash
@pytest.mark.timeout(900)  # a guard against a hang; on 2 loaded cores it takes about 4-5 minutes
def test_the_short_enumeration_kills_at_every_listed_point_and_every_case_passes() -> None:
    done = enumerate_cases("--short", "--jobs", "2", timeout=880)
    failures = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert failures == []
    unreached = {
        line.split()[1] for line in done.stdout.splitlines() if line.startswith("unreached: ")
    }
    assert unreached <= set(UNREACHED)
    assert "kill points reached by no scenario and not listed: 0" in done.stdout
    cases, passed, failed = totals(done.stdout)
    # One case per distinct point: every listed point that is reachable, plus the tool and
    # step points of the scenario apps.
    assert cases >= len(KILL_POINTS) - len(UNREACHED)
    assert (passed, failed) == (cases, 0)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.crash
def test_a_planned_kill_that_never_fires_is_a_failed_case() -> None:
    # "lookupp" is misspelled, and the scenario calls lookup three times, not four.
    done = enumerate_cases(
        "--scenario",
        "parallel",
        "--point",
        "tool:lookupp",
        "--point",
        "tool:lookup#4",
        "--point",
        "tool:lookup#3",
        timeout=110,
    )
    failures = sorted(line for line in done.stdout.splitlines() if line.startswith("FAILED"))
    assert failures == [
        "FAILED parallel @ tool:lookup#4: CaseFailed: the planned kill never fired",
        "FAILED parallel @ tool:lookupp#1: CaseFailed: the planned kill never fired",
    ]
    assert totals(done.stdout) == (3, 1, 2)
    assert done.returncode == 1
