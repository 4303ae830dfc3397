"""The records that resolve a tool batch: one outcome per call, then the batch's commit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hearth.effects import DONE, NOT_DONE, Done
from hearth.errors import described, message_of
from hearth.records import (
    AssistantToolCall,
    Record,
    ToolOutcome,
    ToolResultsCommitted,
    ToolStepSettled,
)
from hearth.runtime.recovery import (
    RERUN_STEP,
    SETS_STEP,
    WRITES_STEP,
    InterruptedTool,
    MessageView,
)


def call_outcome(
    call: AssistantToolCall, content: Any, duration_ms: int = 0, *, is_error: bool = False
) -> ToolOutcome:
    """The outcome of one call the model made (successful unless ``is_error``)."""
    return _outcome(call.message_id, call, content, is_error=is_error, duration_ms=duration_ms)


def error_outcome(
    call: AssistantToolCall, kind: str, message: str, duration_ms: int = 0, **more: Any
) -> ToolOutcome:
    """A call's error outcome: ``{"type": kind, "message": message, **more}``."""
    content = {"type": kind, "message": message, **more}
    return call_outcome(call, content, duration_ms, is_error=True)


def interrupted_outcome(message_id: str, tool: InterruptedTool) -> ToolOutcome:
    """The error outcome of a call cut off by an interruption: not re-run, outcome unknown."""
    content: dict[str, Any] = {
        "type": "interrupted",
        "message": f"The call to {tool.name} was cut off by an interruption; it may or may not "
        "have taken effect. Its outcome is unknown.",
    }
    if tool.child_conversation_id:
        content["child_conversation_id"] = tool.child_conversation_id
    return _outcome(message_id, tool, content, is_error=True)


def reconciled_done(
    message_id: str, call: AssistantToolCall | InterruptedTool, answer: Done
) -> ToolOutcome:
    """The outcome of a cut-off call whose reconcile answered ``Done``: its real result (or
    error), as the external system reported it."""
    error = answer.error
    if error is None:
        return _outcome(message_id, call, answer.result, is_error=False, reconciled=DONE)
    # (An error that cannot be printed is still the call's outcome: it raised here, in every
    # attempt, and the reconcile was asked again each time.)
    if isinstance(error, BaseException):
        content = {"type": "exception", "message": described(error)}
    else:
        content = {"type": "error", "message": message_of(error)}
    return _outcome(message_id, call, content, is_error=True, reconciled=DONE)


def never_happened(message_id: str, tool: InterruptedTool) -> ToolOutcome:
    """At rest (abort, deadline, budget): reconcile answered ``NotDone``, and the call is not run
    again since the submission stops."""
    content = {
        "type": "not_done",
        "message": f"The call to {tool.name} was cut off by an interruption before it took "
        "effect (confirmed by its reconcile); it was not run again.",
    }
    return _outcome(message_id, tool, content, is_error=True, reconciled=NOT_DONE)


def rerun_started(call: AssistantToolCall) -> ToolStepSettled:
    """The bookkeeping record written before a call runs again after ``NotDone``: it counts the
    one re-run a call may have, across crashes."""
    return ToolStepSettled(
        id=f"{call.message_id}:rerun:{call.tool_call_id}",
        tool_call_id=call.tool_call_id,
        step=RERUN_STEP,
        value={"reconciled": NOT_DONE, "interrupted_attempt": call.attempt},
    )


def call_writes(
    call: AssistantToolCall, writes: dict[str, Any], order: dict[str, int]
) -> ToolStepSettled:
    """The bookkeeping record of the state writes a call made, appended with its outcome while
    its batch is still open: they lived only in this attempt's memory, and a recovery that
    completes the batch would have committed it without them (while the model read the
    outcome of the call that made them). ``order``: when, among all the sets of the batch in
    this attempt, each was made (calls finish in another order than they set)."""
    return ToolStepSettled(
        id=f"{call.message_id}:writes:{call.tool_call_id}",
        tool_call_id=call.tool_call_id,
        step=WRITES_STEP,
        value={"writes": writes, "order": order},
    )


# Where a set of state was made: its attempt, its place among that attempt's sets in the batch,
# and (for sets of one place) its record's place in the stream. Of a name's sets, the one at
# the latest place is the one set last.
Place = tuple[int, int, int]


def placed_sets(
    records: Sequence[Record], step: str, key: str
) -> Iterator[tuple[Place, ToolStepSettled, str, Any]]:
    """The sets of state that bookkeeping records of ``step`` (or starting with it) keep, as
    ``{key: {name: value}, "order": {name: place among the batch's sets}}``, each with its
    ``Place``."""
    for position, r in enumerate(records):
        if not (
            isinstance(r, ToolStepSettled)
            and r.step.startswith(step)
            and isinstance(r.value, dict)
            and isinstance(r.value.get(key), dict)
        ):
            continue
        order = r.value.get("order")
        order = order if isinstance(order, dict) else {}
        for name, value in r.value[key].items():
            at = order.get(name)
            yield (r.attempt or 0, at if isinstance(at, int) else 0, position), r, name, value


def kept_writes(records: Sequence[Record], message_id: str, since: int) -> dict[str, Any]:
    """The state writes of the calls of ``message_id`` whose outcomes attempts after ``since``
    recorded before the batch committed (those of earlier attempts are in what a pause
    carried), each name at the value set last, as the batch would have committed it."""
    prefix = f"{message_id}:writes:"
    made = [
        (place, name, value)
        for place, r, name, value in placed_sets(records, WRITES_STEP, "writes")
        if r.id.startswith(prefix) and (r.attempt or 0) > since
    ]
    made.sort(key=lambda m: m[0])
    return {name: value for _, name, value in made}


def replayed_sets(steps: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """What the functions of one call's recorded steps set (``SETS_STEP`` records), by step, to
    be set again as each replays. A name is set again only by the step that set it last:
    replays come in the order the steps are asked for again, not in the order their sets were
    made (two steps run at once)."""
    placed = list(placed_sets(steps, SETS_STEP, "sets"))
    last: dict[str, Place] = {}
    for place, _, name, _ in placed:
        last[name] = max(last.get(name, place), place)
    found: dict[str, dict[str, Any]] = {}
    for place, r, name, value in placed:
        if place == last[name]:
            found.setdefault(str(r.value["step"]), {})[name] = value
    return found


def batch_committed(view: MessageView) -> ToolResultsCommitted:
    """The record that closes the tool batch of one assistant message."""
    return ToolResultsCommitted(
        id=f"{view.message_id}:committed",
        message_id=view.message_id,
        tool_call_ids=[c.tool_call_id for c in view.calls],
    )


def _outcome(
    message_id: str,
    call: AssistantToolCall | InterruptedTool,
    content: Any,
    *,
    is_error: bool,
    duration_ms: int = 0,
    reconciled: str | None = None,
) -> ToolOutcome:
    # The id is fixed by the call, so writing an outcome twice is a no-op.
    return ToolOutcome(
        id=f"{message_id}:outcome:{call.tool_call_id}",
        message_id=message_id,
        tool_call_id=call.tool_call_id,
        name=call.name,
        is_error=is_error,
        content=content,
        duration_ms=duration_ms,
        reconciled=reconciled,
    )
