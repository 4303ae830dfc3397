"""Each test kills a real process with SIGKILL at a named point and restarts on the same file.
After each test, its lab's database and tool log pass the invariant checker (``conftest.labs``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from crashlab import Lab

from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    Record,
    Signal,
    StateWrite,
    SubmissionSettled,
    ToolOutcome,
    ToolStepSettled,
    UserMessage,
)

pytestmark = pytest.mark.crash

ENVELOPE = {"offset", "id", "type", "submission_id", "attempt", "at"}


def of(records: list[Record], kind: type[Record]) -> list[Record]:
    return [r for r in records if isinstance(r, kind)]


def settled(records: list[Record]) -> list[SubmissionSettled]:
    return [r for r in records if isinstance(r, SubmissionSettled)]


def test_killed_before_the_input_was_appended_gets_a_clean_first_attempt(lab: Lab) -> None:
    first = lab.harness.run(
        dispatch=[("toolie", "c1", "charge me")], crash_at="before:user_message"
    )
    assert first.killed
    records = lab.harness.history("toolie/c1")
    assert of(records, UserMessage) == []
    assert lab.harness.run().ok
    records = lab.harness.history("toolie/c1")
    assert len(of(records, UserMessage)) == 1
    assert lab.count("charge") == 1
    (done,) = settled(records)
    assert done.outcome == "completed"
    assert done.reply == "saw charge=ok"


def test_killed_mid_stream_keeps_the_partial_closes_it_and_continues(lab: Lab) -> None:
    first = lab.harness.run(
        dispatch=[("streamer", "c1", "what is the answer?")],
        crash_at="after:assistant_text_delta#2",
    )
    assert first.killed
    partial = "".join(getattr(r, "delta", "") for r in lab.harness.history("streamer/c1"))
    assert partial.startswith("The answer ")
    assert lab.harness.run().ok
    records = lab.harness.history("streamer/c1")
    completed = of(records, AssistantMessageCompleted)
    assert [c.stop_reason for c in completed] == ["aborted", "stop"]
    assert completed[0].text == partial
    signals = [r for r in of(records, Signal) if r.signal_type == "stream_interrupted"]
    assert len(signals) == 1 and signals[0].offset > completed[0].offset
    (done,) = settled(records)
    assert done.outcome == "completed"
    assert done.reply == partial + " (continued after the cut)."  # the whole answer


def test_killed_inside_an_ordinary_tool_does_not_run_it_again(lab: Lab) -> None:
    first = lab.harness.run(dispatch=[("toolie", "c1", "charge me")], crash_at="tool:charge")
    assert first.killed
    assert lab.count("charge") == 0  # killed as the call started
    assert lab.harness.run().ok
    assert lab.count("charge") == 0
    records = lab.harness.history("toolie/c1")
    (outcome,) = of(records, ToolOutcome)
    assert outcome.is_error and outcome.content["type"] == "interrupted"
    # the model's next request contained the interrupted outcome
    (done,) = settled(records)
    assert done.outcome == "completed" and done.reply == "saw charge=interrupted"


def test_killed_after_the_tool_ran_but_before_its_outcome_landed_is_not_run_again(lab: Lab) -> None:
    first = lab.harness.run(
        dispatch=[("toolie", "c1", "charge me")], crash_at="before:tool_outcome"
    )
    assert first.killed
    assert lab.count("charge") == 1
    assert lab.harness.run().ok
    assert lab.count("charge") == 1
    (done,) = settled(lab.harness.history("toolie/c1"))
    assert done.reply == "saw charge=interrupted"


def test_killed_between_two_steps_replays_the_first_and_runs_the_second_once(lab: Lab) -> None:
    first = lab.harness.run(
        dispatch=[("durable", "c1", "provision acme")], crash_at="after:tool_step_settled"
    )
    assert first.killed
    assert lab.ran() == ["provision-start", "step-expensive"]
    assert lab.harness.run().ok
    # the tool re-executed from the top, but the recorded step did not run again
    assert lab.ran() == ["provision-start", "step-expensive", "provision-start", "step-save"]
    records = lab.harness.history("durable/c1")
    (outcome,) = of(records, ToolOutcome)
    assert outcome.content == {"value": 123123123, "saved": "ok", "customer": "acme"}
    (done,) = settled(records)
    assert done.reply == "saw provision=ok"


def test_parallel_calls_keep_the_recorded_outcome_and_mark_the_other(lab: Lab) -> None:
    first = lab.harness.run(dispatch=[("parallel", "c1", "look up")], crash_at="after:tool_outcome")
    assert first.killed
    assert lab.harness.run().ok
    assert lab.count("fast") == 1 and lab.count("slow") == 1
    records = lab.harness.history("parallel/c1")
    outcomes = {o.name: o for o in of(records, ToolOutcome)}
    assert outcomes["fast"].content == "fast done" and not outcomes["fast"].is_error
    assert outcomes["slow"].content["type"] == "interrupted"
    (done,) = settled(records)
    assert done.reply == "saw fast=ok,slow=interrupted"


def test_killed_after_the_response_completed_settles_without_a_model_call(lab: Lab) -> None:
    first = lab.harness.run(
        dispatch=[("finisher", "c1", "hi")], crash_at="before:submission_settled"
    )
    assert first.killed
    assert lab.harness.run().ok  # the script has one response: a second model call would fail
    records = lab.harness.history("finisher/c1")
    assert len(of(records, AssistantMessageStarted)) == 1
    (done,) = settled(records)
    assert done.outcome == "completed" and done.reply == "done once"


def test_killed_until_the_budget_is_spent_fails_with_retry_exhausted(lab: Lab) -> None:
    runs = [lab.harness.run(dispatch=[("fragile", "c1", "work")], crash_at="tool:slow")]
    while len(runs) < 3:
        runs.append(lab.harness.run(crash_at="tool:slow"))
    assert all(r.killed for r in runs)
    assert lab.harness.run().ok  # attempt 4 > max_attempts=3
    records = lab.harness.history("fragile/c1")
    (done,) = settled(records)
    assert done.outcome == "failed" and done.error["type"] == "retry_exhausted"
    (advisory,) = [r for r in of(records, Signal) if r.signal_type == "submission_interrupted"]
    interrupted = done.error["interrupted_tools"]
    assert [t["name"] for t in interrupted] == ["slow"]
    assert advisory.attributes["interrupted_tools"] == interrupted
    assert lab.count("slow") == 0
    (sub,) = lab.harness.submissions("fragile/c1")
    assert sub.attempt == 4
    # the conversation is at rest: the next message processes normally
    nxt = lab.harness.run(dispatch=[("fragile", "c1", "hello again")])
    assert nxt.ok
    last = settled(lab.harness.history("fragile/c1"))[-1]
    assert last.outcome == "completed" and last.reply == "hello, all is well"


def test_deadline_passed_while_the_process_was_dead_fails_with_timeout(lab: Lab) -> None:
    first = lab.harness.run(dispatch=[("hurried", "c1", "quick")], crash_at="tool:slow")
    assert first.killed
    time.sleep(1.6)
    assert lab.harness.run().ok
    records = lab.harness.history("hurried/c1")
    (done,) = settled(records)
    assert done.outcome == "failed" and done.error["type"] == "timeout"
    assert [t["name"] for t in done.error["interrupted_tools"]] == ["slow"]
    assert any(r.signal_type == "submission_interrupted" for r in of(records, Signal))


def test_abort_of_crash_interrupted_work_settles_aborted(lab: Lab) -> None:
    first = lab.harness.run(dispatch=[("toolie", "c1", "charge me")], crash_at="tool:charge")
    assert first.killed
    assert lab.harness.request_abort("toolie/c1")
    assert lab.harness.run().ok
    records = lab.harness.history("toolie/c1")
    (done,) = settled(records)
    assert done.outcome == "aborted"
    assert [t["name"] for t in done.error["interrupted_tools"]] == ["charge"]
    (advisory,) = [r for r in of(records, Signal) if r.signal_type == "submission_aborted"]
    assert advisory.attributes["interrupted_tools"][0]["name"] == "charge"
    assert lab.count("charge") == 0


def test_a_state_write_in_an_interrupted_batch_is_rolled_back(lab: Lab) -> None:
    first = lab.harness.run(
        dispatch=[("stateful", "c1", "bump and wait")], crash_at="after:tool_outcome"
    )
    assert first.killed
    assert lab.count("bump") == 1
    assert lab.harness.run().ok
    assert lab.count("bump") == 1  # its outcome was recorded: kept, not re-run
    records = lab.harness.history("stateful/c1")
    assert of(records, StateWrite) == []
    assert lab.harness.state("stateful/c1") == {}
    (done,) = settled(records)
    assert done.reply == "saw bump=ok,slow=interrupted; count=0"


def test_a_state_write_in_a_committed_batch_is_kept_across_a_crash(lab: Lab) -> None:
    first = lab.harness.run(
        dispatch=[("stateful", "c1", "bump")], crash_at="after:tool_results_committed"
    )
    assert first.killed
    assert lab.harness.run().ok
    records = lab.harness.history("stateful/c1")
    (write,) = of(records, StateWrite)
    assert write.name == "count" and write.value == 1
    assert lab.harness.state("stateful/c1") == {"count": 1}
    (done,) = settled(records)
    assert done.reply == "saw bump=ok; count=1"


@pytest.mark.parametrize("crash", [False, True])
def test_a_recovered_batch_commits_each_value_set_last_as_without_a_crash(
    make_lab: Callable[[str], Lab], crash: bool
) -> None:
    """``o1`` set ``a`` first and finished last of the two ordinary calls; ``o2`` set it later.
    Killed after ``o1``'s outcome, the recovery merged the calls' writes in the order their
    outcomes were recorded, and committed ``o1``'s older value (and a value set to what it
    already was could override a real change the same way)."""
    lab = make_lab("writesapp:app")
    batch = [
        ["ord", "o1", {"key": "a", "value": "first", "post": 0.6}],
        ["ord", "o2", {"key": "a", "value": "second", "pre": 0.2}],
        ["dur", "d1", {"key": "b", "value": 1, "post": 1.5}],
    ]
    run = lab.harness.run(
        dispatch=[("w", "x", json.dumps(batch))],
        crash_at="after:tool_outcome#2" if crash else None,  # o2's, then o1's
    )
    assert run.killed is crash
    if crash:
        assert lab.harness.run().ok
    assert lab.harness.state("w/x") == {"a": "second", "b": 1}


@pytest.mark.parametrize("crash", [False, True])
def test_state_set_inside_a_step_is_set_again_when_the_step_replays(
    make_lab: Callable[[str], Lab], crash: bool
) -> None:
    """Killed after the step that set ``a`` was recorded, before its batch committed: the
    recovery ran the call again, the step replayed without its function, and ``a`` was never
    committed. The step's record keeps what its function set; a replay sets it again."""
    lab = make_lab("writesapp:app")
    batch = [["inside", "i1", {"key": "a", "value": "kept", "post": 0.3}]]
    run = lab.harness.run(
        dispatch=[("w", "x", json.dumps(batch))],
        crash_at="after:tool_step_settled" if crash else None,  # the step "set"
    )
    assert run.killed is crash
    if crash:
        assert lab.harness.run().ok
    assert lab.harness.state("w/x") == {"a": "kept"}
    # Kept in a record of its own, whose fields every release knows: an older one, beside a
    # newer in a rolling redeploy, refuses a record with a field it does not know.
    steps = of(lab.harness.history("w/x"), ToolStepSettled)
    assert {r.step for r in steps} == {"set", "hearth.sets:set", "work"}
    for r in steps:
        assert set(r.to_json()) == ENVELOPE | {"tool_call_id", "step", "value"}


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize(("tool", "last"), [("pair", "late"), ("crossed", "second")])
def test_of_two_steps_run_at_once_the_one_that_set_last_wins_after_a_crash_too(
    make_lab: Callable[[str], Lab], crash: bool, tool: str, last: str
) -> None:
    """Replays come in the order the steps are asked for again: the one asked for first, whose
    set came last, set its value first, and the other's (older) value won. And the step that
    set a name last need not be the one recorded last (``crossed``)."""
    lab = make_lab("writesapp:app")
    batch = [[tool, "p1", {"key": "a", "post": 0.3}]]
    run = lab.harness.run(
        dispatch=[("w", "x", json.dumps(batch))], crash_at="step:work" if crash else None
    )
    assert run.killed is crash
    if crash:
        assert lab.harness.run().ok
    assert lab.harness.state("w/x") == {"a": last}


def test_a_restarted_process_takes_over_a_dead_local_owner_without_waiting_for_the_lease(
    lab: Lab,
) -> None:
    slow_leases = {"HEARTH_LEASE_S": "300", "HEARTH_HEARTBEAT_S": "100", "HEARTH_SCAN_S": "300"}
    first = lab.harness.run(
        dispatch=[("toolie", "c1", "charge me")], crash_at="tool:charge", env=slow_leases
    )
    assert first.killed
    (sub,) = lab.harness.submissions("toolie/c1")
    assert sub.status == "running" and sub.lease_expires_at is not None
    assert sub.lease_expires_at > time.time() + 200  # the dead owner's lease is far from expiry
    # the restart must settle well within its own timeout, long before the lease would expire
    assert lab.harness.run(env=slow_leases, timeout=20).ok
    (done,) = settled(lab.harness.history("toolie/c1"))
    assert done.outcome == "completed"


def test_an_unexpected_exception_in_an_attempt_fails_the_run_instead_of_passing_as_a_retry(
    lab: Lab,
) -> None:
    with pytest.raises(RuntimeError, match="a bug the runtime did not expect"):
        lab.harness.run(dispatch=[("buggy", "c1", "hi")])


def test_the_harness_works_from_an_async_test_too(lab: Lab) -> None:
    """Called from a running event loop (an async test, a notebook), every read of the
    database raised "asyncio.run() cannot be called from a running event loop", after the
    child had been killed."""
    import asyncio

    async def an_async_test() -> None:
        first = lab.harness.run(dispatch=[("toolie", "c1", "charge me")], crash_at="tool:charge")
        assert first.killed
        assert lab.harness.run().ok
        (done,) = settled(lab.harness.history("toolie/c1"))
        assert done.reply == "saw charge=interrupted"
        assert lab.harness.submissions("toolie/c1")[0].outcome == "completed"
        assert lab.harness.check_invariants() == []

    asyncio.run(an_async_test())


def test_a_crash_after_the_last_outcome_of_a_batch_keeps_its_state_writes(lab: Lab) -> None:
    # The batch's last outcome, its state writes and its commit are one append: there is no
    # moment where every call has its outcome but the writes are not committed.
    first = lab.harness.run(dispatch=[("stateful", "c1", "bump")], crash_at="after:tool_outcome")
    assert first.killed
    assert lab.count("bump") == 1
    assert lab.harness.state("stateful/c1") == {"count": 1}
    assert lab.harness.run().ok
    assert lab.count("bump") == 1
    (done,) = settled(lab.harness.history("stateful/c1"))
    assert done.reply == "saw bump=ok; count=1"
