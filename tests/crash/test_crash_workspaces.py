"""Workspaces across a SIGKILL (SPEC §16): a file written by the first attempt is there for the
recovering attempt in a durable workspace, and gone in an ephemeral one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from crashlab import Lab

from hearth.records import Record, SubmissionSettled, ToolOutcome

pytestmark = pytest.mark.crash

# The write's batch is committed; the process dies before the next model call.
AFTER_THE_WRITE = "after:tool_results_committed"


def outcome(records: list[Record], call_id: str) -> ToolOutcome:
    (found,) = [r for r in records if isinstance(r, ToolOutcome) and r.tool_call_id == call_id]
    return found


def settled(records: list[Record]) -> SubmissionSettled:
    (done,) = [r for r in records if isinstance(r, SubmissionSettled)]
    return done


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_durable_workspace_keeps_the_first_attempts_file_through_a_kill(
    make_lab: Callable[[str], Lab],
) -> None:
    lab = make_lab("workspaceapp:app")
    first = lab.harness.run(dispatch=[("keeper", "c1", "take a note")], crash_at=AFTER_THE_WRITE)
    assert first.killed
    directory = lab.tmp_path / "workspaces" / "durable" / "keeper" / "c1"
    assert (directory / "notes.txt").read_text() == "from the first attempt"
    assert lab.harness.run().ok
    records = lab.harness.history("keeper/c1")
    assert outcome(records, "write").attempt == 1
    read = outcome(records, "read")
    assert read.attempt == 2 and not read.is_error
    done = settled(records)
    assert done.outcome == "completed" and done.reply == "read: from the first attempt"
    assert (directory / "notes.txt").read_text() == "from the first attempt"


def test_an_ephemeral_workspace_loses_the_first_attempts_file_with_the_kill(
    make_lab: Callable[[str], Lab],
) -> None:
    lab = make_lab("workspaceapp:app")
    first = lab.harness.run(dispatch=[("scratch", "c1", "take a note")], crash_at=AFTER_THE_WRITE)
    assert first.killed
    parent = lab.tmp_path / "workspaces" / "ephemeral" / "scratch" / "c1"
    (left,) = [p for p in parent.iterdir()]  # what the killed attempt wrote is still on disk
    assert (left / "notes.txt").read_text() == "from the first attempt"
    assert lab.harness.run().ok
    records = lab.harness.history("scratch/c1")
    assert outcome(records, "write").attempt == 1
    read = outcome(records, "read")
    assert read.attempt == 2 and read.is_error
    done = settled(records)
    assert done.outcome == "completed"
    assert done.reply == "read failed: WorkspaceError: 'notes.txt' does not exist"
    assert files_under(parent) == []  # the killed attempt's directory and the second's are gone
