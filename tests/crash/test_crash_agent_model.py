"""Crash tests of hooks, joining and delegated tasks: real SIGKILLs, restarts on the same file.
After each test, every lab's database passes the invariant checker (``conftest.labs``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crashlab import Lab

from hearth.records import (
    AssistantToolCall,
    ChildConversationLinked,
    ConversationCreated,
    HookSeamCommitted,
    Record,
    Signal,
    StateWrite,
    SubmissionSettled,
    ToolOutcome,
    UserMessage,
)
from hearth.testing import CrashHarness

pytestmark = pytest.mark.crash
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def of(records: list[Record], kind: type[Record]) -> list[Record]:
    return [r for r in records if isinstance(r, kind)]


# --- the once-only welcome --------------------------------------------------------------------


@pytest.mark.parametrize("crash_at", ["hook:on_agent_start", "before:hook_seam_committed"])
def test_the_welcome_mail_is_sent_at_most_once_through_a_kill_inside_the_hook(
    tmp_path: Path, crash_at: str
) -> None:
    mail_log = tmp_path / "mail.log"
    harness = CrashHarness(
        "welcome:app",
        db=tmp_path / "h.db",
        env={"WELCOME_MAIL_LOG": str(mail_log)},
        pythonpath=[EXAMPLES],
    )
    messages = [("support", "c1", text) for text in ("hello", "still there?", "thanks")]
    assert harness.run(dispatch=messages, crash_at=crash_at).killed
    harness.run_until_settled()
    records = harness.history("support/c1")
    assert [s.outcome for s in of(records, SubmissionSettled)] == ["completed"] * 3
    mails = [json.loads(line) for line in mail_log.read_text().splitlines()]
    delivered = [m for m in mails if m["event"] == "delivered"]
    assert [m["key"] for m in delivered] == ["welcome:c1"]  # at most once per key
    assert harness.state("support/c1") == {"welcome_sent": True}  # flag and mail log agree
    assert len(of(records, StateWrite)) == 1
    assert len(of(records, HookSeamCommitted)) == 3
    harness.assert_invariants()


# --- joining ----------------------------------------------------------------------------------


@pytest.mark.parametrize("crash_at", ["before:user_message#2", "after:user_message#2"])
def test_a_crash_around_the_join_point_loses_nothing_and_processes_nothing_twice(
    lab: Lab, crash_at: str
) -> None:
    messages = [("stateful", "c1", "bump"), ("stateful", "c1", "and then?")]
    assert lab.harness.run(dispatch=messages, crash_at=crash_at).killed
    assert lab.harness.run().ok
    records = lab.harness.history("stateful/c1")
    inputs = [r.content for r in of(records, UserMessage)]
    assert inputs == ["bump", "and then?"]  # never lost, never twice, in order
    assert {s.outcome for s in of(records, SubmissionSettled)} == {"completed"}
    assert lab.count("bump") == 1
    subs = lab.harness.submissions("stateful/c1")
    assert len({s.reply for s in subs}) == 1  # the joined one got the host's reply
    assert subs[1].status == "joined"
    # (each settled once, its row agreeing with its record: the invariant checker, after the test)


# --- delegated tasks ----------------------------------------------------------------------------


def children(lab: Lab, parent: str) -> list[str]:
    links = of(lab.harness.history(parent), ChildConversationLinked)
    return [link.child_conversation_id for link in links]


def test_an_interrupted_child_is_resumed_from_its_transcript(lab_delegating: Lab) -> None:
    lab = lab_delegating
    assert lab.harness.run(dispatch=[("lead", "p", "norway")], crash_at="tool:search").killed
    assert lab.harness.run().ok
    (child,) = children(lab, "lead/p")
    child_records = lab.harness.history(child)
    assert isinstance(child_records[0], ConversationCreated)
    assert lab.count("search:norway") == 0  # the ordinary call in the child was not re-run
    (outcome,) = of(child_records, ToolOutcome)
    assert outcome.content["type"] == "interrupted"
    (done,) = of(lab.harness.history("lead/p"), SubmissionSettled)
    assert done.outcome == "completed" and done.reply == "norway: interrupted"


def test_grandchildren_resume_first_and_recovery_interrupted_again_reuses_the_same_child(
    lab_delegating: Lab,
) -> None:
    lab = lab_delegating
    assert lab.harness.run(dispatch=[("lead", "p", "deep dive")], crash_at="tool:search").killed
    # the recovery itself is killed: the checker's model call after repairing its batch
    assert lab.harness.run(crash_at="after:assistant_message_started").killed
    assert lab.harness.run().ok
    (child,) = children(lab, "lead/p")
    (grandchild,) = children(lab, child)
    assert grandchild.startswith("checker/")
    grand_done = of(lab.harness.history(grandchild), ToolOutcome)[-1]
    child_outcome = of(lab.harness.history(child), ToolOutcome)[-1]
    assert child_outcome.content == "checked (interrupted)"
    assert grand_done.content["type"] == "interrupted"
    (done,) = of(lab.harness.history("lead/p"), SubmissionSettled)
    assert done.reply == "deep dive: ok"


def test_several_interrupted_children_in_one_batch_all_resume_before_it_commits(
    lab_delegating: Lab,
) -> None:
    lab = lab_delegating
    first = lab.harness.run(dispatch=[("lead", "p", "alpha, beta")], crash_at="tool:search#2")
    assert first.killed
    assert lab.harness.run().ok
    parent = lab.harness.history("lead/p")
    assert len(children(lab, "lead/p")) == 2
    # one outcome per task before the one commit: the invariant checker, after the test
    (done,) = of(parent, SubmissionSettled)
    assert done.outcome == "completed"


def test_an_ordinary_call_a_dead_recovery_marked_is_still_named_when_the_work_fails(
    lab_delegating: Lab,
) -> None:
    """The lead's own search, cut off beside its task, was marked interrupted by a recovery that
    then died before the batch committed (the model never saw the marker). The failure left it
    out of ``error.interrupted_tools`` and the advisory: which calls a user was told had an
    unknown outcome depended on how many attempts had run."""
    lab = lab_delegating
    env = {"LEAD_SEARCH": "on", "LEAD_ATTEMPTS": "2"}
    assert lab.harness.run(
        dispatch=[("lead", "p", "norway")], crash_at="child:start", env=env
    ).killed
    # The recovery marks the search, resumes the child, and dies before the batch commits.
    assert lab.harness.run(crash_at="child:end", env=env).killed
    assert lab.harness.run(env=env).ok
    (failed,) = lab.harness.submissions("lead/p")
    assert failed.outcome == "failed" and failed.error is not None
    assert failed.error["type"] == "retry_exhausted"
    named = [(t["name"], t["tool_call_id"]) for t in failed.error["interrupted_tools"]]
    calls = [(c.name, c.tool_call_id) for c in of(lab.harness.history("lead/p"), AssistantToolCall)]
    assert named == calls and [n for n, _ in named] == ["task", "search"]
    (advisory,) = [
        s
        for s in of(lab.harness.history("lead/p"), Signal)
        if s.signal_type.startswith("submission")
    ]
    assert advisory.attributes["interrupted_tools"] == failed.error["interrupted_tools"]
    assert lab.count("search:lead notes") <= 1  # cut off once, never run again


def test_a_render_failure_after_a_dead_recovery_names_the_marked_call_with_an_advisory(
    lab: Lab,
) -> None:
    """The recovery marked ``slow`` and died before its batch committed; the next one could not
    render. The failure named ``slow`` but left no advisory, which it leaves when no recovery
    died in between: whether users were told depended on how many attempts ran."""
    assert lab.harness.run(dispatch=[("parallel", "c1", "go")], crash_at="tool:slow").killed
    assert lab.harness.run(crash_at="batch:commit").killed
    assert lab.harness.run(env={"RENDER_FAILS": "parallel"}).ok
    (failed,) = lab.harness.submissions("parallel/c1")
    assert failed.error is not None and failed.error["type"] == "agent_error"
    assert "slow" in [t["name"] for t in failed.error["interrupted_tools"]]
    records = lab.harness.history("parallel/c1")
    (advisory,) = [s for s in of(records, Signal) if s.signal_type == "submission_interrupted"]
    assert advisory.attributes["interrupted_tools"] == failed.error["interrupted_tools"]


def test_a_child_whose_agent_is_no_longer_declared_gets_an_error_outcome(
    lab_delegating: Lab,
) -> None:
    lab = lab_delegating
    assert lab.harness.run(dispatch=[("lead", "p", "norway")], crash_at="tool:search").killed
    assert lab.harness.run(env={"DELEGATE": "off"}).ok
    parent = lab.harness.history("lead/p")
    (outcome,) = of(parent, ToolOutcome)
    assert outcome.is_error and outcome.content["type"] == "subagent_missing"
    (done,) = of(parent, SubmissionSettled)
    assert done.outcome == "completed"


def test_a_recovery_whose_agent_cannot_render_still_leaves_the_batch_at_rest(lab: Lab) -> None:
    """The submission failed with its tool batch open and no call named in the error: every
    later request carried calls without results, which a provider refuses, so the conversation
    was broken for good, even once the render was fixed."""
    assert lab.harness.run(dispatch=[("parallel", "c1", "go")], crash_at="tool:slow").killed
    assert lab.harness.run(env={"RENDER_FAILS": "parallel"}).ok  # a release with a render bug
    (failed,) = lab.harness.submissions("parallel/c1")
    assert failed.outcome == "failed" and failed.error is not None
    assert failed.error["type"] == "agent_error"
    assert "slow" in [t["name"] for t in failed.error["interrupted_tools"]]
    records = lab.harness.history("parallel/c1")
    slow = next(r for r in of(records, ToolOutcome) if r.name == "slow")
    assert slow.content["type"] == "interrupted"
    assert lab.count("slow") == 0  # killed as it began: marked, never run again
    # The render fixed, the next message runs as in any conversation.
    assert lab.harness.run(dispatch=[("parallel", "c1", "again")], env={"SLOW_S": "0.1"}).ok
    settled = of(lab.harness.history("parallel/c1"), SubmissionSettled)
    assert [s.outcome for s in settled] == ["failed", "completed"]


def test_a_child_whose_agent_cannot_render_in_recovery_is_left_at_rest(
    lab_delegating: Lab,
) -> None:
    lab = lab_delegating
    assert lab.harness.run(dispatch=[("lead", "p", "norway")], crash_at="tool:search").killed
    assert lab.harness.run(env={"RENDER_FAILS": "researcher"}).ok
    (child,) = children(lab, "lead/p")
    (marked,) = of(lab.harness.history(child), ToolOutcome)  # its batch closed
    assert marked.content["type"] == "interrupted"
    (outcome,) = of(lab.harness.history("lead/p"), ToolOutcome)
    assert outcome.is_error and outcome.content["type"] == "task_failed"


def test_an_exhausted_parent_budget_marks_the_task_interrupted_with_the_child_id(
    lab_delegating: Lab,
) -> None:
    lab = lab_delegating
    budget = {"LEAD_ATTEMPTS": "2"}
    assert lab.harness.run(
        dispatch=[("lead", "p", "deep dive")], crash_at="tool:search", env=budget
    ).killed
    assert lab.harness.run(crash_at="after:assistant_message_started", env=budget).killed
    assert lab.harness.run(env=budget).ok
    (child,) = children(lab, "lead/p")
    (done,) = of(lab.harness.history("lead/p"), SubmissionSettled)
    assert done.outcome == "failed" and done.error["type"] == "retry_exhausted"
    assert done.error["interrupted_tools"] == [
        {
            "name": "task",
            "tool_call_id": done.error["interrupted_tools"][0]["tool_call_id"],
            "child_conversation_id": child,
        }
    ]


def test_a_committed_seam_is_not_run_again_after_a_crash(tmp_path: Path) -> None:
    mail_log = tmp_path / "mail.log"
    harness = CrashHarness(
        "welcome:app",
        db=tmp_path / "h.db",
        env={"WELCOME_MAIL_LOG": str(mail_log)},
        pythonpath=[EXAMPLES],
    )
    first = harness.run(dispatch=[("support", "c1", "hello")], crash_at="after:hook_seam_committed")
    assert first.killed
    assert harness.run().ok
    assert len(mail_log.read_text().splitlines()) == 1  # the hook did not even ask again
    assert len(of(harness.history("support/c1"), HookSeamCommitted)) == 1
    harness.assert_invariants()
