"""Bringing to rest: closing what a stopped attempt left open, so its stream reads as finished.

One procedure serves a submission that settles aborted or failed and a child conversation whose
parent stops: the unresolved calls of the last tool batch get an ``interrupted`` outcome and the
batch commits, after the children of those calls have been brought to rest the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from hearth.records import Record, Signal
from hearth.runtime.journal import Journal
from hearth.runtime.outcomes import batch_committed, interrupted_outcome
from hearth.runtime.recovery import (
    Action,
    Decision,
    InterruptedTool,
    MessageView,
    assemble_messages,
    close_open_messages,
    unresolved_tools,
)
from hearth.runtime.scope import AttemptScope, Settlement
from hearth.store.base import Fence, Store


def mark_interrupted(view: MessageView, interrupted: Sequence[InterruptedTool]) -> list[Record]:
    """Close a tool batch a dead or stopped attempt left open: an ``interrupted`` outcome for
    each unresolved call, then the batch's ``tool_results_committed`` — also when every call
    already has its outcome and only the commit is missing (an abort between the two)."""
    if view.committed or not view.calls:
        return []
    records: list[Record] = [interrupted_outcome(view.message_id, tool) for tool in interrupted]
    records.append(batch_committed(view))
    return records


async def bring_to_rest(
    store: Store, fence: Fence, records: Sequence[Record], interrupted: Sequence[InterruptedTool]
) -> list[Record]:
    """Bring the child conversations of the ``interrupted`` calls to rest, then return the
    records that close the last tool batch of ``records``."""
    for tool in interrupted:
        if tool.child_conversation_id:
            await bring_child_to_rest(store, fence, tool.child_conversation_id)
    views = assemble_messages(records)
    return mark_interrupted(views[-1], interrupted) if views else []


async def bring_child_to_rest(store: Store, fence: Fence, conversation_id: str) -> None:
    """Leave an abandoned child conversation (and its own children) at rest: its cut-off message
    closed and its unresolved calls marked interrupted, as for any interrupted submission."""
    journal = Journal(store, conversation_id, fence)
    await journal.load(-1)
    interrupted = unresolved_tools(assemble_messages(journal.records))
    closes = close_open_messages(journal.records)
    records = [*closes, *await bring_to_rest(store, fence, journal.records, interrupted)]
    if records:
        await journal.append(*records)


async def settlement_at_rest(scope: AttemptScope, d: Decision) -> Settlement:
    """Settle aborted or failed: mark unresolved calls, leave an advisory signal, settle."""
    records = await bring_to_rest(
        scope.store, scope.sub.fence, scope.submission_records(), d.interrupted
    )
    error = d.error
    if d.signal is not None:
        records.append(
            Signal(
                id=f"{scope.sub.id}:{d.signal}",
                signal_type=d.signal,
                body=(error or {}).get("message", ""),
                attributes={
                    "reason": (error or {}).get("type"),
                    "interrupted_tools": [t.to_json() for t in d.interrupted],
                },
            )
        )
    outcome = "aborted" if d.action is Action.SETTLE_ABORTED else "failed"
    if outcome == "aborted" and error is not None:
        error = {**error, "interrupted_tools": [t.to_json() for t in d.interrupted]}
    return Settlement(outcome, error=error, records=records)
