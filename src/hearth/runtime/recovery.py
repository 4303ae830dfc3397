"""What to do next with a submission, decided from durable evidence alone.

Normal execution and recovery are the same loop: before every step the runner shows
``classify_recovery`` what the stream holds after the submission's input, and does what it says.
A fresh attempt, one resumed after a crash, and one interrupted by an abort or a deadline differ
only in the evidence. Every rule of the recovery table lives here, in pure functions.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantTextDelta,
    AssistantToolCall,
    ChildConversationLinked,
    Compaction,
    HookSeamCommitted,
    Record,
    Signal,
    ToolOutcome,
    ToolResultsCommitted,
    ToolStepSettled,
    UserMessage,
)
from hearth.store.rows import counted_attempts

TASK_TOOL = "task"  # the built-in delegation tool
# The bookkeeping step an ordinary call gets when its reconcile answered NotDone, written before
# the call runs again: a call with it is never reconciled (nor run) again.
RERUN_STEP = "hearth.rerun"
# The bookkeeping step that keeps the state writes of a call whose outcome is recorded before its
# batch commits, appended with that outcome: a recovery that completes the batch commits them.
WRITES_STEP = "hearth.state_writes"
BOOKKEEPING_STEPS = frozenset({RERUN_STEP, WRITES_STEP})
# The bookkeeping step that keeps what a step's function set (``hearth.sets:`` and the step's
# name, value ``{"step", "sets"}``), appended with the step's record: a replay sets it again. A
# record of its own, not a new field of the step's: an older release, running beside a newer
# one in a rolling redeploy, refuses a record with a field it does not know, and reads this one
# as a step nobody asks for.
SETS_STEP = "hearth.sets:"
TRANSIENT_BUDGET = 3  # consecutive transient provider errors retried per submission
BACKOFF_BASE_S = 2.0


class Action(Enum):
    START = "start"  # the input was never appended: append it (a clean first attempt)
    CONTINUE = "continue"  # ask the model for the next turn
    CONTINUE_PARTIAL = "continue_partial"  # tell the model its stream was cut, then continue
    RUN_TOOLS = "run_tools"  # run or repair the open tool batch, then commit it
    RETRY_TRANSIENT = "retry_transient"  # back off, then ask the model again
    COMPACT = "compact"  # summarise older records, then retry the turn
    RUN_START_HOOKS = "run_start_hooks"  # the on_agent_start seam of a delivered input
    RUN_FINISH_HOOKS = "run_finish_hooks"  # the on_agent_finish seam where the response stops
    SETTLE_COMPLETED = "settle_completed"
    SETTLE_ABORTED = "settle_aborted"
    SETTLE_FAILED = "settle_failed"


class CallPlan(Enum):
    KEEP = "keep"  # its outcome is recorded: never run again
    RUN = "run"  # made by this attempt: run it
    REEXECUTE = "reexecute"  # durable tool of a dead attempt: run again, steps replay
    RESUME_CHILD = "resume_child"  # task call of a dead attempt: resume the child conversation
    CHILD_GONE = "child_gone"  # task call whose subagent is no longer declared: error outcome
    INTERRUPTED = "interrupted"  # ordinary call of a dead attempt: unknown outcome, not re-run
    RECONCILE = "reconcile"  # ordinary call of a dead attempt whose tool can reconcile: ask it


@dataclass(frozen=True)
class Evidence:
    """What the runner knows: the records after the submission's input and the row's facts."""

    records: Sequence[Record]  # everything from the input record on (empty: never appended)
    input_appended: bool
    attempt: int
    max_attempts: int
    deadline_passed: bool
    abort_requested: bool
    start_hooks: bool = False  # the current render declares on_agent_start callbacks
    finish_hooks: bool = False  # the current render declares on_agent_finish callbacks
    waits: int = 0  # attempts that ended by a durable wait: they do not count toward the budget
    releases: int = 0  # attempts a graceful shutdown gave back: nor do these
    tokens_spent: int = 0  # model tokens the submission spent so far (all turns, all attempts)
    max_tokens: int | None = None  # its spending budget; None: unbounded
    # The next turn's request, rebuilt from the records, is estimated past the model's input
    # budget (``window − reserve``). Only asked for when the decision is a turn (``TURNS``).
    over_budget: bool = False

    @property
    def interruptions(self) -> int:
        """The attempts that count toward ``max_attempts``, this one included."""
        return counted_attempts(self.attempt, self.waits, self.releases)


START_HOOK = "on_agent_start"
FINISH_HOOK = "on_agent_finish"
CONTINUATION = "continuation"  # the signal type of text appended by an on_agent_finish hook


@dataclass(frozen=True)
class InterruptedTool:
    name: str
    tool_call_id: str
    child_conversation_id: str | None = None

    def to_json(self) -> dict[str, str]:
        out = {"name": self.name, "tool_call_id": self.tool_call_id}
        if self.child_conversation_id:
            out["child_conversation_id"] = self.child_conversation_id
        return out


@dataclass(frozen=True)
class Decision:
    action: Action
    message_id: str | None = None  # the assistant message concerned
    reply: str | None = None  # for SETTLE_COMPLETED
    # for SETTLE_FAILED / SETTLE_ABORTED; for COMPACT, the provider's refusal (if it refused)
    error: dict[str, Any] | None = None
    interrupted: tuple[InterruptedTool, ...] = ()  # calls to mark when bringing to rest
    delay: float = 0.0  # for RETRY_TRANSIENT
    partial: bool = False  # RETRY_TRANSIENT after a cut stream that kept output
    signal: str | None = None  # the advisory signal type to append when settling


@dataclass
class MessageView:
    """One assistant message assembled from its records."""

    message_id: str
    attempt: int | None
    started: bool = False
    text_parts: list[str] = field(default_factory=list)
    calls: list[AssistantToolCall] = field(default_factory=list)
    completed: AssistantMessageCompleted | None = None
    outcomes: dict[str, ToolOutcome] = field(default_factory=dict)
    committed: bool = False
    children: dict[str, str] = field(default_factory=dict)  # tool_call_id → child conversation
    reruns: set[str] = field(default_factory=set)  # calls run again after reconcile said NotDone
    interrupted_signal: bool = False
    index: int = 0  # position in the evidence

    @property
    def streamed_text(self) -> str:
        return "".join(self.text_parts)


def assemble_messages(records: Sequence[Record]) -> list[MessageView]:
    """Group the assistant-message records (and their tool outcomes) by message id, in order."""
    views: dict[str, MessageView] = {}
    by_call: dict[str, MessageView] = {}
    for i, rec in enumerate(records):
        mid = getattr(rec, "message_id", None)
        if isinstance(rec, AssistantMessageStarted | AssistantTextDelta | AssistantToolCall):
            assert mid is not None
            view = views.get(mid)
            if view is None:
                view = views[mid] = MessageView(mid, rec.attempt, index=i)
            view.started = True
            if isinstance(rec, AssistantTextDelta):
                view.text_parts.append(rec.delta)
            elif isinstance(rec, AssistantToolCall):
                view.calls.append(rec)
                by_call[rec.tool_call_id] = view
        elif isinstance(rec, AssistantMessageCompleted) and mid in views:
            views[mid].completed = rec
        elif isinstance(rec, ToolOutcome) and mid in views:
            views[mid].outcomes[rec.tool_call_id] = rec
        elif isinstance(rec, ToolResultsCommitted) and mid in views:
            views[mid].committed = True
        elif isinstance(rec, ChildConversationLinked) and rec.tool_call_id in by_call:
            by_call[rec.tool_call_id].children[rec.tool_call_id] = rec.child_conversation_id
        elif (
            isinstance(rec, ToolStepSettled)
            and rec.step == RERUN_STEP
            and rec.tool_call_id in by_call
        ):
            by_call[rec.tool_call_id].reruns.add(rec.tool_call_id)
        elif isinstance(rec, Signal) and rec.signal_type == "stream_interrupted":
            target = rec.attributes.get("message_id")
            if isinstance(target, str) and target in views:
                views[target].interrupted_signal = True
    return sorted(views.values(), key=lambda v: v.index)


def close_open_messages(records: Sequence[Record]) -> list[AssistantMessageCompleted]:
    """Phase 1: a message that started but never completed is closed as ``aborted``, keeping
    its persisted partial text. Ids are deterministic, so writing this twice is a no-op."""
    return [
        AssistantMessageCompleted(
            id=f"{v.message_id}:completed",
            message_id=v.message_id,
            stop_reason="aborted",
            text=v.streamed_text,
        )
        for v in assemble_messages(records)
        if v.completed is None
    ]


def may_reconcile(view: MessageView, tool_call_id: str, reconcilable: Collection[str]) -> bool:
    """Whether an unresolved call may be reconciled: its tool (by name, in ``reconcilable``)
    declares ``reconcile`` and the call was never run again after a NotDone (at most one re-run
    per call, counted from the records: a second interruption keeps the marker)."""
    name = next((c.name for c in view.calls if c.tool_call_id == tool_call_id), None)
    return name in reconcilable and tool_call_id not in view.reruns


def plan_tool_batch(
    view: MessageView,
    attempt: int,
    declared: dict[str, bool],
    subagents: Sequence[str],
    reconcilable: Collection[str] = (),
) -> dict[str, CallPlan]:
    """How each call of a tool turn is resolved. ``declared`` maps the tool names the current
    render declares to whether they are durable; ``subagents`` are the declared subagent names;
    ``reconcilable`` the declared ordinary tools with a ``reconcile`` function."""
    plan: dict[str, CallPlan] = {}
    for call in view.calls:
        if call.tool_call_id in view.outcomes:
            plan[call.tool_call_id] = CallPlan.KEEP
        elif call.attempt == attempt:
            plan[call.tool_call_id] = CallPlan.RUN
        elif call.name == TASK_TOOL and TASK_TOOL not in declared:
            agent = call.arguments.get("agent") if isinstance(call.arguments, dict) else None
            declared_child = isinstance(agent, str) and agent in subagents
            plan[call.tool_call_id] = (
                CallPlan.RESUME_CHILD if declared_child else CallPlan.CHILD_GONE
            )
        elif declared.get(call.name, False):
            plan[call.tool_call_id] = CallPlan.REEXECUTE
        elif may_reconcile(view, call.tool_call_id, reconcilable):
            plan[call.tool_call_id] = CallPlan.RECONCILE
        else:
            plan[call.tool_call_id] = CallPlan.INTERRUPTED
    return plan


def consecutive_transient_errors(views: Sequence[MessageView]) -> int:
    """Transient provider errors since the last successful turn of this submission."""
    count = 0
    for v in reversed(views):
        done = v.completed
        if done is None:
            continue
        if done.stop_reason == "error" and (done.error or {}).get("kind") == "transient":
            count += 1
        elif done.stop_reason == "aborted" and not v.streamed_text and not v.calls:
            continue  # an empty aborted turn is neither a success nor an error
        else:
            break
    return count


def backoff_delay(errors: int, retry_after: float | None, *, jitter: float | None = None) -> float:
    """2 s·2^(n−1), jittered by ±20 %; a provider's ``Retry-After`` wins when given."""
    if retry_after is not None and retry_after >= 0:
        return float(retry_after)
    base = BACKOFF_BASE_S * 2 ** max(errors - 1, 0)
    j = random.uniform(0.8, 1.2) if jitter is None else jitter
    return float(base * j)


def unresolved_tools(views: Sequence[MessageView]) -> tuple[InterruptedTool, ...]:
    """The calls of the last tool turn that have no outcome, if its batch never committed."""
    return _open_batch_calls(views, marked_too=False)


def unknown_outcomes(views: Sequence[MessageView]) -> tuple[InterruptedTool, ...]:
    """The calls of the last tool turn, if its batch never committed, whose outcome is unknown:
    those with no outcome, and those an earlier attempt marked interrupted (the model never saw
    that marker: the batch it closed did not commit). What a settlement at rest reports."""
    return _open_batch_calls(views, marked_too=True)


def _open_batch_calls(
    views: Sequence[MessageView], *, marked_too: bool
) -> tuple[InterruptedTool, ...]:
    if not views or views[-1].committed:
        return ()
    last = views[-1]
    return tuple(
        InterruptedTool(c.name, c.tool_call_id, last.children.get(c.tool_call_id))
        for c in last.calls
        if (outcome := last.outcomes.get(c.tool_call_id)) is None
        or (marked_too and is_marker(outcome))
    )


def is_marker(outcome: ToolOutcome) -> bool:
    """Whether ``outcome`` is the ``interrupted`` marker of a call cut off by an interruption."""
    content = outcome.content
    return (
        outcome.is_error
        and outcome.reconciled is None
        and isinstance(content, dict)
        and content.get("type") == "interrupted"
    )


def _completed_response(
    views: Sequence[MessageView], records: Sequence[Record]
) -> MessageView | None:
    """The submission's last assistant message if it is a finished response with nothing left
    to do after it: no tool calls, and no input or continuation appended since."""
    if not views:
        return None
    last = views[-1]
    done = last.completed
    if done is None or done.stop_reason not in ("stop", "length") or last.calls:
        return None
    if any(_model_visible(r) for r in records[last.index :]):
        return None
    return last


def _reply(views: Sequence[MessageView], records: Sequence[Record], final: MessageView) -> str:
    """The final response's text, after the text of each cut-off response it continues (the
    model was told to go on from where the saved part stops, without repeating it): the answer
    the reader saw stream in, not its last piece alone."""
    parts = [final.completed.text if final.completed is not None else ""]
    at = views.index(final)
    while at > 0:
        cut = views[at - 1]
        done = cut.completed  # (closed "aborted" after a crash, "error" after a cut)
        if (
            done is None
            or cut.calls
            or any(_model_visible(r) for r in records[cut.index : views[at].index])
        ):
            break
        at -= 1
        if not done.text and done.stop_reason in ("error", "aborted"):
            continue  # a try that failed before it said anything (an overload, a crash)
        if not cut.interrupted_signal:
            break
        parts.insert(0, done.text)
    return "".join(parts)


def _model_visible(rec: Record) -> bool:
    return isinstance(rec, UserMessage) or (
        isinstance(rec, Signal) and rec.signal_type == CONTINUATION
    )


def _seams(records: Sequence[Record], hook: str) -> set[str]:
    return {r.message_id for r in records if isinstance(r, HookSeamCommitted) and r.hook == hook}


def input_key(rec: Record) -> str:
    """The id a start seam is keyed on: a user message's ``message_id``, else the record id."""
    return rec.message_id if isinstance(rec, UserMessage) else rec.id


def _pending_start_seam(records: Sequence[Record], views: Sequence[MessageView]) -> str | None:
    """The first delivered input after the last assistant message whose start seam is missing."""
    done = _seams(records, START_HOOK)
    after = views[-1].index if views else -1
    for i, rec in enumerate(records):
        if i <= after:
            continue
        delivered = isinstance(rec, UserMessage) or (i == 0 and isinstance(rec, Signal))
        if delivered and input_key(rec) not in done:
            return input_key(rec)
    return None


# The decisions that ask the model for a turn: a request over the window compacts first.
TURNS = frozenset({Action.CONTINUE, Action.CONTINUE_PARTIAL, Action.RETRY_TRANSIENT})
# The decisions that call the model: the spending budget is checked before each.
MODEL_CALLS = TURNS | {Action.COMPACT}


def classify_recovery(ev: Evidence) -> Decision:
    """Decide the next step from durable evidence. Callers close open messages first
    (``close_open_messages``); this function assumes every message in ``ev.records`` is closed
    or was never started."""
    decision = _classify(ev)
    if decision.action in TURNS and ev.over_budget:
        decision = _compact_or_fail(ev.records, decision)
    if (
        decision.action in MODEL_CALLS
        and ev.max_tokens is not None
        and ev.tokens_spent >= ev.max_tokens
    ):
        # At a turn boundary, past the budget: stop before another model call.
        return _fail(
            "budget_exhausted",
            f"the submission spent {ev.tokens_spent} model tokens; its budget is"
            f" {ev.max_tokens} (Durability.max_tokens)",
            (),
        )
    return decision


def _classify(ev: Evidence) -> Decision:
    views = assemble_messages(ev.records)
    final = _completed_response(views, ev.records) if ev.input_appended else None
    if final is not None:
        stopping = ev.abort_requested or ev.deadline_passed or ev.interruptions > ev.max_attempts
        if (
            ev.finish_hooks
            and not stopping
            and final.message_id not in _seams(ev.records, FINISH_HOOK)
        ):
            return Decision(Action.RUN_FINISH_HOOKS, message_id=final.message_id)
        # Finished work is never discarded: past the budget, the deadline, or an abort intent.
        reply = _reply(views, ev.records, final)
        return Decision(Action.SETTLE_COMPLETED, message_id=final.message_id, reply=reply)

    interrupted = unresolved_tools(views)
    if ev.abort_requested:
        return Decision(
            Action.SETTLE_ABORTED,
            error={"type": "aborted", "message": "the submission was aborted"},
            interrupted=interrupted,
            signal="submission_aborted",
        )
    if ev.deadline_passed:
        return _fail("timeout", "the submission ran past its deadline", interrupted)
    if ev.interruptions > ev.max_attempts:
        return _fail(
            "retry_exhausted",
            f"the submission was interrupted {ev.interruptions - 1} times (max_attempts="
            f"{ev.max_attempts})",
            interrupted,
        )
    if not ev.input_appended:
        return Decision(Action.START)
    if ev.start_hooks:
        pending = _pending_start_seam(ev.records, views)
        if pending is not None:
            return Decision(Action.RUN_START_HOOKS, message_id=pending)
    if not views:
        return Decision(Action.CONTINUE)

    last = views[-1]
    done = last.completed
    if done is None:  # callers close open messages first; treat as a turn with no output
        return Decision(Action.CONTINUE)
    if last.calls and not last.committed:
        return Decision(Action.RUN_TOOLS, message_id=last.message_id)
    if last.committed:
        return Decision(Action.CONTINUE)
    if done.stop_reason == "error":
        return _after_error(ev.records, views, last)
    if done.stop_reason == "aborted":
        if last.streamed_text and not last.interrupted_signal:
            return Decision(Action.CONTINUE_PARTIAL, message_id=last.message_id)
        return Decision(Action.CONTINUE)  # a turn that persisted no output: send it again
    return Decision(Action.CONTINUE)


def _after_error(
    records: Sequence[Record], views: Sequence[MessageView], last: MessageView
) -> Decision:
    done = last.completed
    assert done is not None
    error = dict(done.error or {})
    kind = error.get("kind")
    if kind == "transient":
        errors = consecutive_transient_errors(views)
        if errors > TRANSIENT_BUDGET:
            return _fail(
                "provider_error",
                f"the model provider failed {errors} times in a row: {error.get('message', '')}",
                (),
            )
        retry_after = error.get("retry_after")
        return Decision(
            Action.RETRY_TRANSIENT,
            message_id=last.message_id,
            delay=backoff_delay(
                errors, retry_after if isinstance(retry_after, int | float) else None
            ),
            error=error,  # what is said if the retry would come after the deadline
            partial=bool(last.streamed_text) and not last.interrupted_signal,
        )
    if kind == "overflow":
        if any(isinstance(r, Compaction) for r in records[last.index :]):
            return Decision(Action.CONTINUE)  # compacted: retry the turn
        return _compact_or_fail(
            records, Decision(Action.COMPACT, message_id=last.message_id, error=error)
        )
    return _fail("provider_error", str(error.get("message", "the model provider failed")), ())


def _compact_or_fail(records: Sequence[Record], turn: Decision) -> Decision:
    """The context is too long for ``turn``: compact, unless a compaction already happened
    since the conversation last moved on (then the turn was its retry: retry only once)."""
    # (a turn's own error is the provider's refusal only when it was an overflow: a transient
    # error's decision reaches here too, when hearth's estimate finds the retry too long)
    overflowed = turn.error if turn.error and turn.error.get("kind") == "overflow" else None
    if compacted_since_progress(records):
        refused = f" (the provider: {overflowed.get('message', '')})" if overflowed else ""
        return _fail(
            "context_overflow",
            f"the context is still too long for the model's window after compaction{refused}",
            (),
        )
    return Decision(Action.COMPACT, message_id=turn.message_id, error=overflowed)


def compacted_since_progress(records: Sequence[Record]) -> bool:
    """Whether a compaction was appended after the last progress of the conversation: a model
    answer that produced output, or a user message. Counted from records, so a restart neither
    forgets a compaction nor counts one whose record was never written."""
    for rec in reversed(records):
        if isinstance(rec, Compaction):
            return True
        if isinstance(rec, UserMessage):
            return False
        if isinstance(rec, AssistantMessageCompleted) and _answered(rec):
            return False
    return False


def _answered(done: AssistantMessageCompleted) -> bool:
    """Whether the model answered this request (the context fit): it ended normally, or was
    cut off after producing output."""
    return done.stop_reason in ("stop", "tool_use", "length") or (
        done.stop_reason == "aborted" and bool(done.text)
    )


def _fail(kind: str, message: str, interrupted: tuple[InterruptedTool, ...]) -> Decision:
    return Decision(
        Action.SETTLE_FAILED,
        error={
            "type": kind,
            "message": message,
            "interrupted_tools": [t.to_json() for t in interrupted],
        },
        interrupted=interrupted,
        signal="submission_interrupted" if kind in ("timeout", "retry_exhausted") else None,
    )
