"""Random workloads, random kill points, then the invariants of the accepted-work contract."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from crashlab import Lab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantToolCall,
    ChildConversationLinked,
    HookSeamCommitted,
    SubmissionSettled,
    ToolResultsCommitted,
    ToolStepSettled,
    UserMessage,
)

pytestmark = pytest.mark.crash

# Every point but the documented at-least-once window (a step's function finished, its record
# not yet written), where running the step again is the contract.
KILL_POINTS = [
    "before:user_message",
    "after:user_message",
    "after:assistant_message_started",
    "after:assistant_text_delta",
    "after:assistant_message_completed",
    "tool:fast",
    "tool:slow",
    "tool:provision",
    "step:one",
    "step:two",
    "after:tool_step_settled",
    "before:tool_outcome",
    "after:tool_outcome",
    "before:tool_results_committed",
    "after:tool_results_committed",
    "before:submission_settled",
    "after:submission_settled",
    "hook:on_agent_start",
    "before:hook_seam_committed",
    "after:hook_seam_committed",
    "after:child_conversation_linked",
]

messages = st.lists(
    st.tuples(
        st.sampled_from(["c1", "c2"]),
        st.sampled_from(["plain", "stream", "tools", "slow", "delegate"]),
    ),
    min_size=1,
    max_size=4,
)
kills = st.lists(
    st.tuples(st.sampled_from(KILL_POINTS), st.integers(min_value=1, max_value=3)),
    min_size=1,
    max_size=3,
)


# A longer soak: HEARTH_CRASH_EXAMPLES=100 pytest tests/crash/test_random_crashes.py
EXAMPLES = int(os.environ.get("HEARTH_CRASH_EXAMPLES", "12"))


@pytest.mark.timeout(120 + 20 * EXAMPLES)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(workload=messages, kill_plan=kills)
def test_every_submission_settles_once_and_nothing_recorded_runs_again(
    workload: list[tuple[str, str]], kill_plan: list[tuple[str, int]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp), "mixedapp:app")
        conversations = sorted({conv for conv, _ in workload})
        dispatch = [("mixed", conv, f"{kind} #{i}") for i, (conv, kind) in enumerate(workload)]
        recorded_by: dict[
            tuple[str, str, str], int
        ] = {}  # step → the run after which it was on disk
        plan: list[str | None] = [f"{point}#{nth}" for point, nth in kill_plan]
        run = 0
        while True:
            crash_at = plan[run] if run < len(plan) else None
            result = lab.harness.run(
                dispatch=dispatch if run == 0 else [],
                crash_at=crash_at,
                env={"HEARTH_TEST_RUN": str(run)},
            )
            for conv in streams(lab, [f"mixed/{c}" for c in conversations]):
                for r in lab.harness.history(conv):
                    if isinstance(r, ToolStepSettled):
                        recorded_by.setdefault((conv, r.tool_call_id, r.step), run)
            run += 1
            if result.ok and run >= len(plan):
                break
            assert run < len(plan) + 20, "the work did not settle"
        check_invariants(lab, set(conversations), len(workload), recorded_by)


def streams(lab: Lab, top: list[str]) -> list[str]:
    """The conversations and, recursively, the child conversations of their tasks."""
    found, todo = [], list(top)
    while todo:
        conv = todo.pop()
        found.append(conv)
        todo += [
            r.child_conversation_id
            for r in lab.harness.history(conv)
            if isinstance(r, ChildConversationLinked)
        ]
    return found


def check_invariants(
    lab: Lab,
    conversations: set[str],
    admitted: int,
    recorded_by: dict[tuple[str, str, str], int],
) -> None:
    subs = lab.harness.submissions()
    assert len(subs) == admitted
    assert all(s.outcome in ("completed", "failed", "aborted") for s in subs)
    settled_ids: Counter[str] = Counter()
    runs = [tuple(line.split("|")) for line in lab.ran()]
    for conv in streams(lab, [f"mixed/{c}" for c in conversations]):
        records = lab.harness.history(conv)
        top = conv.startswith("mixed/")
        assert [r.offset for r in records] == list(range(len(records)))  # dense offsets
        settled_ids.update(
            r.submission_id or "" for r in records if isinstance(r, SubmissionSettled)
        )
        started = {r.message_id for r in records if isinstance(r, AssistantMessageStarted)}
        completed = {r.message_id for r in records if isinstance(r, AssistantMessageCompleted)}
        assert started == completed  # nobody is left mid-message
        with_calls = {r.message_id for r in records if isinstance(r, AssistantToolCall)}
        committed = {r.message_id for r in records if isinstance(r, ToolResultsCommitted)}
        assert with_calls == committed  # every tool batch was closed
        if top:
            assert isinstance(records[-1], SubmissionSettled)
            seams = [r for r in records if isinstance(r, HookSeamCommitted)]
            inputs = [r for r in records if isinstance(r, UserMessage)]
            assert len(seams) <= len(inputs)  # one start seam per delivered input at most
            # the hook's state writes committed with its seams, never without them
            assert lab.harness.state(conv).get("starts", 0) == len(seams)
        steps = Counter((r.tool_call_id, r.step) for r in records if isinstance(r, ToolStepSettled))
        assert all(n == 1 for n in steps.values())  # steps are recorded exactly once
    assert settled_ids == Counter({s.id: 1 for s in subs})  # each settles exactly once
    for kind, conv, call_id, run in runs:
        if kind == "hook":
            continue
        if kind.startswith("step-"):
            on_disk_after = recorded_by.get((conv, call_id, kind[len("step-") :]))
            # a completed (recorded) step never runs again in a later process
            assert on_disk_after is None or int(run) <= on_disk_after
    ordinary = Counter(
        (kind, conv, call_id) for kind, conv, call_id, _ in runs if kind in ("fast", "slow")
    )
    assert all(n == 1 for n in ordinary.values())  # an ordinary call never runs twice
