"""Reconciled outcomes under real SIGKILLs: a tool records its effect in a ledger keyed by its
tool call id, and its reconcile asks the ledger. After each test, the lab passes the invariant
checker with the tools' own log (an ordinary call may run twice only after its re-run record)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from crashlab import Lab

from hearth.records import (
    ChildConversationLinked,
    Record,
    SubmissionSettled,
    ToolOutcome,
    ToolStepSettled,
)
from hearth.runtime.recovery import RERUN_STEP
from hearth.testing import Ledger

pytestmark = pytest.mark.crash


@pytest.fixture
def payer(make_lab: Callable[[str], Lab], tmp_path: Path) -> tuple[Lab, Ledger]:
    lab = make_lab("reconcileapp:app")
    ledger = Ledger(tmp_path / "ledger")
    lab.harness.env["LEDGER_DIR"] = str(ledger.path)
    return lab, ledger


def outcome(records: list[Record]) -> ToolOutcome:
    (found,) = [r for r in records if isinstance(r, ToolOutcome)]
    return found


def settlement(records: list[Record]) -> SubmissionSettled:
    (found,) = [r for r in records if isinstance(r, SubmissionSettled)]
    return found


def reruns(records: list[Record]) -> list[ToolStepSettled]:
    return [r for r in records if isinstance(r, ToolStepSettled) and r.step == RERUN_STEP]


@pytest.mark.parametrize("tool", ["pay", "pay_sync"])
def test_an_effect_recorded_before_the_kill_reaches_the_model_as_done(
    payer: tuple[Lab, Ledger], tool: str
) -> None:
    lab, ledger = payer
    assert lab.harness.run(dispatch=[("payer", "c1", tool)], crash_at=f"tool-done:{tool}").killed
    assert lab.harness.run().ok
    records = lab.harness.history("payer/c1")
    got = outcome(records)
    assert (got.reconciled, got.is_error, got.content) == ("done", False, {"paid": 5})
    assert settlement(records).reply == f'saw {tool}=ok {{"paid": 5}}'
    assert lab.count(tool) == 1  # the body ran once: reconcile found its effect
    assert reruns(records) == []
    assert ledger.entries() == {got.tool_call_id: {"paid": 5}}


def test_a_kill_before_the_effect_runs_the_call_exactly_once_more(
    payer: tuple[Lab, Ledger],
) -> None:
    lab, ledger = payer
    assert lab.harness.run(dispatch=[("payer", "c1", "pay")], crash_at="ledger:record").killed
    assert ledger.entries() == {}
    assert lab.harness.run().ok
    records = lab.harness.history("payer/c1")
    got = outcome(records)
    assert (got.reconciled, got.is_error, got.content) == ("not_done", False, {"paid": 5})
    assert got.attempt == 2
    assert len(reruns(records)) == 1
    assert settlement(records).outcome == "completed"
    assert lab.count("pay") == 2  # the cut-off run and the one re-run
    assert ledger.entries() == {got.tool_call_id: {"paid": 5}}
    assert [took for _, took, _ in ledger.requests(got.tool_call_id)] == [True]


def test_a_re_run_that_is_interrupted_again_keeps_the_marker(payer: tuple[Lab, Ledger]) -> None:
    lab, ledger = payer
    assert lab.harness.run(dispatch=[("payer", "c1", "pay")], crash_at="ledger:record").killed
    assert lab.harness.run(crash_at="ledger:record").killed  # the re-run is cut off too
    assert lab.harness.run().ok
    records = lab.harness.history("payer/c1")
    got = outcome(records)
    assert got.reconciled is None and got.content["type"] == "interrupted"
    assert len(reruns(records)) == 1
    assert lab.count("pay") == 2  # never a third run
    assert ledger.entries() == {}


def test_a_kill_between_the_answer_and_its_record_asks_again(payer: tuple[Lab, Ledger]) -> None:
    lab, _ = payer
    assert lab.harness.run(dispatch=[("payer", "c1", "pay")], crash_at="tool-done:pay").killed
    assert lab.harness.run(crash_at="reconcile-done:pay").killed
    assert lab.harness.run().ok
    got = outcome(lab.harness.history("payer/c1"))
    assert (got.reconciled, got.content) == ("done", {"paid": 5})
    assert lab.count("pay") == 1


@pytest.mark.parametrize("tool", ["pay_raises", "pay_hangs", "pay_garbage"])
def test_a_reconcile_that_raises_hangs_or_answers_garbage_keeps_the_marker(
    payer: tuple[Lab, Ledger], tool: str
) -> None:
    lab, _ = payer
    assert lab.harness.run(dispatch=[("payer", "c1", tool)], crash_at=f"tool-done:{tool}").killed
    second = lab.harness.run()
    assert second.ok
    records = lab.harness.history("payer/c1")
    got = outcome(records)
    assert got.reconciled is None and got.content["type"] == "interrupted"
    assert got.tool_call_id in second.stderr  # the reason is logged with the call id
    assert settlement(records).reply.startswith(f"saw {tool}=interrupted")
    assert lab.count(tool) == 1


def test_at_rest_done_gives_the_real_outcome(payer: tuple[Lab, Ledger]) -> None:
    lab, ledger = payer
    assert lab.harness.run(dispatch=[("payer", "c1", "pay")], crash_at="tool-done:pay").killed
    lab.harness.request_abort("payer/c1")
    assert lab.harness.run().ok
    records = lab.harness.history("payer/c1")
    got = outcome(records)
    assert (got.reconciled, got.content) == ("done", {"paid": 5})
    assert settlement(records).outcome == "aborted"
    assert lab.count("pay") == 1
    assert ledger.entries() == {got.tool_call_id: {"paid": 5}}


def test_at_rest_not_done_says_the_effect_never_happened(payer: tuple[Lab, Ledger]) -> None:
    lab, ledger = payer
    assert lab.harness.run(dispatch=[("payer", "c1", "pay")], crash_at="ledger:record").killed
    lab.harness.request_abort("payer/c1")
    assert lab.harness.run().ok
    records = lab.harness.history("payer/c1")
    got = outcome(records)
    assert (got.reconciled, got.is_error, got.content["type"]) == ("not_done", True, "not_done")
    assert settlement(records).outcome == "aborted"
    assert lab.count("pay") == 1  # not run again: the submission stops
    assert reruns(records) == []
    assert ledger.entries() == {}


def test_an_abandoned_childs_call_is_reconciled_when_its_parent_comes_to_rest(
    payer: tuple[Lab, Ledger],
) -> None:
    lab, ledger = payer
    assert lab.harness.run(dispatch=[("lead", "c1", "go")], crash_at="tool-done:pay").killed
    lab.harness.request_abort("lead/c1")
    assert lab.harness.run().ok
    parent = lab.harness.history("lead/c1")
    assert settlement(parent).outcome == "aborted"
    (link,) = [r for r in parent if isinstance(r, ChildConversationLinked)]
    got = outcome(lab.harness.history(link.child_conversation_id))
    assert (got.reconciled, got.content) == ("done", {"paid": 5})
    assert lab.count("pay") == 1
    assert ledger.entries() == {got.tool_call_id: {"paid": 5}}


def test_a_reconciled_outcome_that_ends_the_batch_commits_with_its_state_writes(
    payer: tuple[Lab, Ledger],
) -> None:
    """The recovery re-ran ``remember`` (which wrote the state) and ``pay_late``'s reconcile
    answered Done last. That outcome was appended alone: killed right after it, the next
    recovery found every outcome recorded and committed the batch without the state write,
    although nothing was marked interrupted."""
    lab, ledger = payer
    first = lab.harness.run(
        dispatch=[("keeper", "k1", "keep")],
        crash_at="ledger-done:record",  # pay_late's effect landed; remember still sleeps
        env={"REMEMBER_S": "5"},
    )
    assert first.killed
    again = lab.harness.run(crash_at="after:tool_outcome#2", env={"RECONCILE_S": "1"})
    assert again.killed
    assert lab.harness.run().ok
    records = lab.harness.history("keeper/k1")
    outcomes = {r.name: r for r in records if isinstance(r, ToolOutcome)}
    assert outcomes["pay_late"].reconciled == "done"
    assert not any(r.is_error for r in outcomes.values())
    assert lab.harness.state("keeper/k1") == {"notes": ["n1"]}
    assert settlement(records).reply == "kept"
    assert list(ledger.entries().values()) == [{"paid": 5}]


def test_an_outcome_kept_from_a_dead_attempt_keeps_its_calls_state_writes(
    payer: tuple[Lab, Ledger],
) -> None:
    """``jot`` (ordinary) set state and its outcome was recorded; the process died while its
    durable sibling still ran. The recovery ran the sibling again and committed the batch, with
    the sibling's write but without ``jot``'s, although the model read "jotted": those writes
    lived only in the dead attempt's memory. They are now recorded with the outcome."""
    lab, _ = payer
    first = lab.harness.run(
        dispatch=[("keeper", "k1", "jot")], crash_at="after:tool_outcome#1", env={"REMEMBER_S": "5"}
    )
    assert first.killed
    assert lab.harness.run().ok
    records = lab.harness.history("keeper/k1")
    assert {r.name: r.attempt for r in records if isinstance(r, ToolOutcome)} == {
        "jot": 1,
        "remember": 2,
    }
    assert lab.harness.state("keeper/k1") == {"jotted": True, "notes": ["n1"]}
