"""The random soak's bounded forms (``python -m hearth.testing.soak``) in a subprocess: a clean
run ends in ``violations: 0`` with the kills it promised; a run with a fault planted before the
final check fails; and the abort-between-outcomes-and-commit case the soak found, made exact."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from crashlab import Lab
from pgcluster import Cluster, new_schema

from hearth.records import SubmissionSettled, ToolOutcome, ToolResultsCommitted

pytestmark = pytest.mark.crash
SOAK_S = 480  # the soak's own bound; pytest-timeout gets a margin over it

QUICK = {"SLOW_S": "0.1"}
LAST_LINE = re.compile(r"^kills: (\d+), submissions: (\d+), violations: (\d+)$")


def soak(tmp_path: Path, *args: str, timeout: float = SOAK_S) -> tuple[int, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hearth.testing.soak", "--workdir", str(tmp_path / "soak"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its servers too go when it overruns
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    lines = out.strip().splitlines()
    assert lines, err[-3000:]
    assert proc.returncode is not None
    return proc.returncode, lines


def last(lines: list[str]) -> tuple[int, int, int]:
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-20:]
    kills, submissions, violations = (int(g) for g in match.groups())
    return kills, submissions, violations


@pytest.mark.timeout(SOAK_S + 60)
def test_a_bounded_soak_kills_thirty_times_and_finds_nothing(tmp_path: Path) -> None:
    code, lines = soak(tmp_path, "--kills", "30", "--seed", "5")
    kills, submissions, violations = last(lines)
    assert (code, violations) == (0, 0), "\n".join(lines[-40:])
    assert kills >= 30
    assert submissions > kills
    assert any(line.startswith("outcomes reached: ") for line in lines)


@pytest.mark.timeout(SOAK_S + 60)
def test_the_soak_fails_on_a_database_that_breaks_an_invariant(tmp_path: Path) -> None:
    code, lines = soak(tmp_path, "--kills", "1", "--seed", "3", "--servers", "1", "--plant-fault")
    _, _, violations = last(lines)
    assert code != 0
    assert violations >= 1
    assert any("row_matches_settlement" in line for line in lines), lines[-20:]


@pytest.mark.timeout(SOAK_S + 60)
def test_a_bounded_soak_on_postgresql(pg_cluster: Cluster, tmp_path: Path) -> None:
    url = pg_cluster.url(new_schema())
    restart = pg_cluster.restart_command()
    code, lines = soak(
        tmp_path,
        "--kills",
        "20",
        "--seed",
        "9",
        "--servers",
        "2",
        "--pg",
        url,
        "--pg-restart-cmd",
        restart,
    )
    kills, _, violations = last(lines)
    assert (code, violations) == (0, 0), "\n".join(lines[-40:])
    assert kills >= 20
    assert any(line.startswith("restarted the database mid-soak") for line in lines)


def test_an_abort_after_the_calls_ended_but_before_the_commit_still_closes_the_batch(
    lab: Lab,
) -> None:
    first = lab.harness.run(
        dispatch=[("parallel", "c1", "look up")], crash_at="batch:commit", env=QUICK
    )
    assert first.killed
    records = lab.harness.history("parallel/c1")
    # The last call's outcome goes with the commit (and its state writes): not recorded yet.
    assert [r.name for r in records if isinstance(r, ToolOutcome)] == ["fast"]
    assert lab.harness.request_abort("parallel/c1")
    assert lab.harness.run().ok
    records = lab.harness.history("parallel/c1")
    (commit,) = [r for r in records if isinstance(r, ToolResultsCommitted)]
    assert sorted(commit.tool_call_ids) == ["call_0_0", "call_0_1"]
    outcomes = {r.name: r for r in records if isinstance(r, ToolOutcome)}
    assert outcomes["slow"].is_error and outcomes["fast"].content == "fast done"
    (done,) = [r for r in records if isinstance(r, SubmissionSettled)]
    assert done.outcome == "aborted"
