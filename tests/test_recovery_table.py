"""The recovery classifier, one row of the recovery table per case, from hand-built evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantTextDelta,
    AssistantToolCall,
    ChildConversationLinked,
    Compaction,
    Record,
    Signal,
    ToolOutcome,
    ToolResultsCommitted,
    UserMessage,
)
from hearth.runtime.recovery import (
    Action,
    CallPlan,
    Evidence,
    assemble_messages,
    backoff_delay,
    classify_recovery,
    close_open_messages,
    plan_tool_batch,
)


@dataclass
class Stream:
    """Builds the records of one submission with attempt numbers and offsets."""

    attempt: int = 1
    records: list[Record] = field(default_factory=list)

    def add(self, rec: Record) -> Stream:
        self.records.append(rec.stamped("s1", self.attempt).with_offset(len(self.records) + 1))
        return self

    def user(self) -> Stream:
        return self.add(UserMessage(id="s1:input", message_id="s1", content="hi"))

    def started(self, mid: str = "m1") -> Stream:
        return self.add(AssistantMessageStarted(id=f"{mid}:started", message_id=mid, model="x/y"))

    def delta(self, text: str, mid: str = "m1", seq: int = 0) -> Stream:
        return self.add(AssistantTextDelta(id=f"{mid}:d{seq}", message_id=mid, seq=seq, delta=text))

    def call(self, cid: str, name: str = "t", mid: str = "m1", **args: Any) -> Stream:
        return self.add(
            AssistantToolCall(
                id=f"{mid}:call:{cid}", message_id=mid, tool_call_id=cid, name=name, arguments=args
            )
        )

    def completed(
        self,
        stop: str = "stop",
        text: str = "",
        mid: str = "m1",
        error: dict[str, Any] | None = None,
    ) -> Stream:
        return self.add(
            AssistantMessageCompleted(
                id=f"{mid}:completed", message_id=mid, stop_reason=stop, text=text, error=error
            )
        )

    def outcome(self, cid: str, name: str = "t", mid: str = "m1") -> Stream:
        return self.add(
            ToolOutcome(
                id=f"{mid}:outcome:{cid}",
                message_id=mid,
                tool_call_id=cid,
                name=name,
                is_error=False,
                content="ok",
            )
        )

    def committed(self, *cids: str, mid: str = "m1") -> Stream:
        return self.add(
            ToolResultsCommitted(id=f"{mid}:committed", message_id=mid, tool_call_ids=list(cids))
        )

    def then(self, attempt: int) -> Stream:
        self.attempt = attempt
        return self

    def evidence(
        self,
        *,
        attempt: int | None = None,
        max_attempts: int = 10,
        deadline_passed: bool = False,
        abort: bool = False,
    ) -> Evidence:
        records = self.records + [
            c.stamped("s1", self.attempt) for c in close_open_messages(self.records)
        ]
        return Evidence(
            records=records,
            input_appended=bool(records),
            attempt=attempt if attempt is not None else self.attempt,
            max_attempts=max_attempts,
            deadline_passed=deadline_passed,
            abort_requested=abort,
        )


def decide(s: Stream, **kw: Any) -> Any:
    return classify_recovery(s.evidence(**kw))


# --- the rows of the recovery table ----------------------------------------------------------


def test_input_never_appended_requeues_a_clean_first_attempt() -> None:
    assert decide(Stream()).action is Action.START


def test_completed_response_settles_completed() -> None:
    d = decide(Stream().user().started().delta("done").completed(text="done"))
    assert d.action is Action.SETTLE_COMPLETED and d.reply == "done"


@pytest.mark.parametrize(
    "facts",
    [{"attempt": 11, "max_attempts": 10}, {"deadline_passed": True}, {"abort": True}],
    ids=["past-the-budget", "past-the-deadline", "abort-after-completion"],
)
def test_completed_response_wins_over_budget_deadline_and_abort(facts: dict[str, Any]) -> None:
    d = decide(Stream().user().started().completed(text="done"), **facts)
    assert d.action is Action.SETTLE_COMPLETED


def test_a_turn_that_persisted_no_output_is_sent_again() -> None:
    s = Stream().user().started().then(2)
    assert close_open_messages(s.records)[0].text == ""
    assert decide(s).action is Action.CONTINUE


def test_input_appended_and_nothing_else_continues() -> None:
    assert decide(Stream().user().then(2)).action is Action.CONTINUE


def test_a_partial_response_is_closed_and_continued_with_a_stream_interrupted_signal() -> None:
    s = Stream().user().started().delta("The ans").then(2)
    (close,) = close_open_messages(s.records)
    assert close.stop_reason == "aborted" and close.text == "The ans"
    d = decide(s)
    assert d.action is Action.CONTINUE_PARTIAL and d.message_id == "m1"


def test_a_partial_already_signalled_is_not_signalled_twice() -> None:
    s = Stream().user().started().delta("The ans").completed("aborted", "The ans")
    s.add(
        Signal(
            id="m1:interrupted", signal_type="stream_interrupted", attributes={"message_id": "m1"}
        )
    )
    assert decide(s).action is Action.CONTINUE


def test_a_tool_turn_with_unresolved_calls_is_repaired() -> None:
    s = Stream().user().started().call("c1").call("c2").completed("tool_use").outcome("c1").then(2)
    d = decide(s)
    assert d.action is Action.RUN_TOOLS and d.message_id == "m1"


def test_a_committed_tool_turn_continues_the_loop() -> None:
    s = Stream().user().started().call("c1").completed("tool_use").outcome("c1").committed("c1")
    assert decide(s.then(2)).action is Action.CONTINUE


def test_a_transient_provider_error_is_retried_after_backoff() -> None:
    s = Stream().user().started().completed("error", error={"kind": "transient", "message": "503"})
    d = decide(s)
    assert d.action is Action.RETRY_TRANSIENT and 1.6 <= d.delay <= 2.4


def test_retry_after_wins_over_the_backoff() -> None:
    err = {"kind": "transient", "message": "429", "retry_after": 7}
    assert decide(Stream().user().started().completed("error", error=err)).delay == 7


def test_transient_errors_past_the_budget_fail_with_provider_error() -> None:
    s = Stream().user()
    for i in range(4):
        s.started(f"m{i}").completed(
            "error", mid=f"m{i}", error={"kind": "transient", "message": "x"}
        )
    d = decide(s)
    assert d.action is Action.SETTLE_FAILED and d.error["type"] == "provider_error"


def test_a_successful_turn_resets_the_transient_budget() -> None:
    s = Stream().user()
    for i in range(3):
        s.started(f"e{i}").completed(
            "error", mid=f"e{i}", error={"kind": "transient", "message": "x"}
        )
    s.started("ok").call("c1", mid="ok").completed("tool_use", mid="ok").outcome("c1", mid="ok")
    s.committed("c1", mid="ok")
    s.started("e9").completed("error", mid="e9", error={"kind": "transient", "message": "x"})
    assert decide(s).action is Action.RETRY_TRANSIENT


def test_a_context_overflow_compacts_then_retries_once() -> None:
    s = Stream().user().started().completed("error", error={"kind": "overflow", "message": "long"})
    assert decide(s).action is Action.COMPACT
    s.add(Compaction(id="s1:compaction", summary="sum", first_kept_offset=1))
    assert decide(s).action is Action.CONTINUE
    s.started("m2").completed("error", mid="m2", error={"kind": "overflow", "message": "long"})
    d = decide(s)
    assert d.action is Action.SETTLE_FAILED and d.error["type"] == "context_overflow"


def test_a_terminal_provider_error_fails() -> None:
    s = (
        Stream()
        .user()
        .started()
        .completed("error", error={"kind": "terminal", "message": "401 bad key"})
    )
    d = decide(s)
    assert d.action is Action.SETTLE_FAILED and d.error == {
        "type": "provider_error",
        "message": "401 bad key",
        "interrupted_tools": [],
    }


def test_a_durable_abort_intent_settles_aborted_and_names_interrupted_tools() -> None:
    s = Stream().user().started().call("c1", "charge").completed("tool_use").then(2)
    d = decide(s, abort=True)
    assert d.action is Action.SETTLE_ABORTED and d.signal == "submission_aborted"
    assert [t.to_json() for t in d.interrupted] == [{"name": "charge", "tool_call_id": "c1"}]


def test_abort_of_work_that_never_started_settles_aborted() -> None:
    assert decide(Stream(), abort=True).action is Action.SETTLE_ABORTED


def test_past_max_attempts_brings_to_rest_and_fails_retry_exhausted() -> None:
    s = Stream().user().started().call("c1", "slow").completed("tool_use").then(4)
    d = decide(s, attempt=4, max_attempts=3)
    assert d.action is Action.SETTLE_FAILED and d.error["type"] == "retry_exhausted"
    assert d.signal == "submission_interrupted"
    assert d.error["interrupted_tools"] == [{"name": "slow", "tool_call_id": "c1"}]


def test_past_the_deadline_fails_with_timeout() -> None:
    d = decide(Stream().user().started().delta("x"), deadline_passed=True)
    assert d.action is Action.SETTLE_FAILED and d.error["type"] == "timeout"


def test_an_unresolved_task_call_names_its_child_conversation() -> None:
    s = Stream().user().started().call("c1", "task", agent="researcher", prompt="p")
    s.completed("tool_use")
    s.add(
        ChildConversationLinked(
            id="m1:child:c1", tool_call_id="c1", child_conversation_id="researcher/x"
        )
    )
    d = decide(s.then(2), deadline_passed=True)
    assert d.error["interrupted_tools"] == [
        {"name": "task", "tool_call_id": "c1", "child_conversation_id": "researcher/x"}
    ]


# --- tool-batch repair -----------------------------------------------------------------------


def _batch() -> Stream:
    s = Stream().user().started()
    s.call("a", "lookup").call("b", "provision").call("c", "charge").call("d", "task", agent="r")
    s.call("e", "task", agent="gone")
    return s.completed("tool_use").outcome("a", "lookup")


def test_repair_keeps_recorded_outcomes_reexecutes_durable_resumes_children_marks_the_rest() -> (
    None
):
    (view,) = assemble_messages(_batch().records)
    plan = plan_tool_batch(view, 2, {"lookup": False, "provision": True, "charge": False}, ["r"])
    assert plan == {
        "a": CallPlan.KEEP,
        "b": CallPlan.REEXECUTE,
        "c": CallPlan.INTERRUPTED,
        "d": CallPlan.RESUME_CHILD,
        "e": CallPlan.CHILD_GONE,
    }


def test_a_tool_no_longer_declared_durable_falls_back_to_interrupted() -> None:
    (view,) = assemble_messages(_batch().records)
    plan = plan_tool_batch(view, 2, {"provision": False}, [])
    assert plan["b"] is CallPlan.INTERRUPTED and plan["d"] is CallPlan.CHILD_GONE


def test_calls_made_by_the_current_attempt_run() -> None:
    (view,) = assemble_messages(_batch().records)
    plan = plan_tool_batch(view, 1, {}, [])
    assert plan["a"] is CallPlan.KEEP
    assert {plan[c] for c in "bcde"} == {CallPlan.RUN}


def test_backoff_doubles_per_consecutive_error() -> None:
    assert [backoff_delay(n, None, jitter=1.0) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]


def test_the_model_sees_tool_results_in_call_order_whatever_order_they_finished_in() -> None:
    from hearth.providers.base import ToolResult
    from hearth.runtime.model_context import build_context

    s = Stream().user().started().call("a", "slow").call("b", "fast").completed("tool_use")
    s.outcome("b", "fast").outcome("a", "slow").committed("a", "b")
    _, messages = build_context(s.records)
    assert [m.tool_call_id for m in messages if isinstance(m, ToolResult)] == ["a", "b"]
