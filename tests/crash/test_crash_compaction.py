"""SIGKILL around a compaction inside a long tool loop, then restart: the loop completes, with
exactly the compactions an uninterrupted run makes (none repeated, none skipped), and the rule
"compact once per progress" read from records survives the restart.

The app is ``tests/apps/compactapp.py``: a 200-turn walk under a 1000-token window, whose
scripted model refuses any request past the window or without the user's message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from compactapp import TASK
from crashlab import Lab

from hearth.records import (
    AssistantMessageCompleted,
    Compaction,
    Record,
    SubmissionSettled,
    ToolOutcome,
    UserMessage,
)

pytestmark = pytest.mark.crash


def of(records: list[Record], kind: type[Record]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


def walk(lab: Lab, crash_at: str | None = None) -> list[Record]:
    """Dispatch the walk (killing the process at ``crash_at``), restart until it settles,
    and return the conversation's records."""
    first = lab.harness.run(dispatch=[("walker", "c1", TASK)], crash_at=crash_at, timeout=120)
    if crash_at is None:
        assert first.ok
    else:
        assert first.killed, f"{crash_at} was not reached"
        assert lab.harness.run(timeout=120).ok
    return lab.harness.history("walker/c1")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[int]:
    """The cuts (``first_kept_offset``) of an uninterrupted run."""
    records = walk(Lab(tmp_path_factory.mktemp("reference"), "compactapp:app"))
    (settled,) = of(records, SubmissionSettled)
    assert (settled.outcome, settled.reply) == ("completed", "Arrived after 200 steps.")
    return [c.first_kept_offset for c in of(records, Compaction)]


@pytest.mark.parametrize(
    "crash_at",
    [
        "compaction:start#3",  # the summary is about to be asked for
        "compaction:chunk#7",  # the summary is streaming
        "compaction:end#12",  # the summary arrived, its record is not written
        "after:compaction#5",  # the record is written, the turn it makes room for is not asked
    ],
)
def test_a_kill_around_a_compaction_restarts_into_the_same_compactions(
    make_lab: Callable[[str], Lab], reference: list[int], crash_at: str
) -> None:
    lab = make_lab("compactapp:app")
    records = walk(lab, crash_at)
    (sub,) = lab.harness.submissions("walker/c1")
    assert (sub.outcome, sub.attempt) == ("completed", 2)
    (settled,) = of(records, SubmissionSettled)
    assert settled.reply == "Arrived after 200 steps."
    compactions = of(records, Compaction)
    # One record per compaction: the same cuts as the uninterrupted run, none twice.
    assert [c.first_kept_offset for c in compactions] == reference
    (task,) = of(records, UserMessage)
    assert all(c.kept_offsets == [task.offset] for c in compactions)
    # The restart picked the walk up where the records left it: every step exactly once.
    assert [o.content["step"] for o in of(records, ToolOutcome)] == list(range(1, 201))
    assert not [c for c in of(records, AssistantMessageCompleted) if c.stop_reason == "error"]
    # The kill fell in the first attempt; compactions of both attempts are on record.
    assert {c.attempt for c in compactions} == {1, 2}
    assert lab.count("walk") == 200
