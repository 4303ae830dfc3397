"""Bringing to rest: closing what a stopped attempt left open, so its stream reads as finished.

One procedure serves a submission that settles aborted or failed and a child conversation whose
parent stops: the unresolved calls of the last tool batch get an ``interrupted`` outcome and the
batch commits, after the children of those calls have been brought to rest the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from hearth.agent import Agent
from hearth.effects import Done, NotDone
from hearth.errors import app_failure
from hearth.records import Record, Signal, ToolOutcome
from hearth.runtime.journal import Journal
from hearth.runtime.outcomes import (
    batch_committed,
    interrupted_outcome,
    never_happened,
    reconciled_done,
)
from hearth.runtime.reconcile import ask, reconcile_call
from hearth.runtime.recovery import (
    Action,
    Decision,
    InterruptedTool,
    MessageView,
    assemble_messages,
    close_open_messages,
    may_reconcile,
    unknown_outcomes,
    unresolved_tools,
)
from hearth.runtime.scope import AttemptScope, Settlement
from hearth.store.base import Fence, Store
from hearth.tools import Tool

# Asked for each unresolved call before it is marked: an outcome that replaces the marker.
Reconciler = Callable[[MessageView, InterruptedTool], Awaitable[ToolOutcome | None]]
# The reconciler of a (child) conversation, from the tools its agent declares now; None: markers.
Reconcilers = Callable[[str], Awaitable[Reconciler | None]]


def mark_interrupted(
    view: MessageView,
    interrupted: Sequence[InterruptedTool],
    decided: Mapping[str, ToolOutcome] | None = None,
) -> list[Record]:
    """Close a tool batch a dead or stopped attempt left open: an ``interrupted`` outcome for
    each unresolved call (or the one ``decided`` by its reconcile), then the batch's
    ``tool_results_committed`` — also when every call already has its outcome and only the
    commit is missing (an abort between the two)."""
    if view.committed or not view.calls:
        return []
    decided = decided or {}
    records: list[Record] = [
        decided.get(tool.tool_call_id) or interrupted_outcome(view.message_id, tool)
        for tool in interrupted
    ]
    records.append(batch_committed(view))
    return records


async def bring_to_rest(
    store: Store,
    fence: Fence,
    records: Sequence[Record],
    interrupted: Sequence[InterruptedTool],
    reconciler: Reconciler | None = None,
    reconcilers: Reconcilers | None = None,
) -> list[Record]:
    """Bring the child conversations of the ``interrupted`` calls to rest, then return the
    records that close the last tool batch of ``records``."""
    for tool in interrupted:
        if tool.child_conversation_id:
            await bring_child_to_rest(store, fence, tool.child_conversation_id, reconcilers)
    views = assemble_messages(records)
    if not views:
        return []
    view = views[-1]
    decided: dict[str, ToolOutcome] = {}
    if reconciler is not None and not view.committed:
        answers = await asyncio.gather(*(reconciler(view, tool) for tool in interrupted))
        decided = {o.tool_call_id: o for o in answers if o is not None}
    return mark_interrupted(view, interrupted, decided)


def reconciler_for(tools: Mapping[str, Tool], conversation_id: str) -> Reconciler:
    """Reconcile at rest: ``Done`` gives the call its real outcome; ``NotDone`` an error outcome
    saying it never took effect (the submission stops: nothing runs again); else the marker."""
    reconcilable = [name for name, t in tools.items() if t.reconcile is not None]

    async def reconcile(view: MessageView, tool: InterruptedTool) -> ToolOutcome | None:
        if not may_reconcile(view, tool.tool_call_id, reconcilable):
            return None
        call = next(c for c in view.calls if c.tool_call_id == tool.tool_call_id)
        answer = await ask(tools[call.name], reconcile_call(call, conversation_id))
        if isinstance(answer, Done):
            return reconciled_done(view.message_id, call, answer)
        if isinstance(answer, NotDone):
            return never_happened(view.message_id, tool)
        return None

    return reconcile


async def bring_child_to_rest(
    store: Store, fence: Fence, conversation_id: str, reconcilers: Reconcilers | None = None
) -> None:
    """Leave an abandoned child conversation (and its own children) at rest: its cut-off message
    closed and its unresolved calls marked interrupted (or reconciled), as for any interrupted
    submission."""
    journal = Journal(store, conversation_id, fence)
    await journal.load(-1)
    interrupted = unresolved_tools(assemble_messages(journal.records))
    closes = close_open_messages(journal.records)
    reconciler = None if reconcilers is None else await reconcilers(conversation_id)
    records = [
        *closes,
        *await bring_to_rest(store, fence, journal.records, interrupted, reconciler, reconcilers),
    ]
    if records:
        await journal.append(*records)


async def settlement_at_rest(
    scope: AttemptScope,
    d: Decision,
    tools: Mapping[str, Tool] | None = None,
    subagents: Mapping[str, Agent] | None = None,
) -> Settlement:
    """Settle aborted or failed: mark unresolved calls (asking the reconcile of those of
    ``tools`` that have one), leave an advisory signal, settle. ``subagents``: the agents the
    render declared as subagents (the App may not list them)."""
    reconciler = None if tools is None else reconciler_for(tools, scope.conversation_id)
    env = scope.env
    subagent_agents = dict(subagents or {})

    async def reconcilers(conversation_id: str) -> Reconciler | None:
        # An abandoned child's calls are reconciled with the tools its agent declares now.
        agent_name, _, id = conversation_id.partition("/")
        agent = env.agents.get(agent_name) or subagent_agents.get(agent_name)
        if agent is None:
            return None
        try:
            rendered = agent.render(id, await env.store.get_state(conversation_id))
        except BaseException as exc:
            if not app_failure(exc, asyncio.current_task()):  # (a sync call: none was closed)
                raise
            return None  # its agent cannot render: the calls keep their markers
        for name, sub in rendered.subagents.items():  # its own children's agents
            subagent_agents.setdefault(name, sub.agent)
        return reconciler_for(rendered.tools, conversation_id)

    before = scope.submission_records()
    records = await bring_to_rest(
        scope.store, scope.sub.fence, before, d.interrupted, reconciler, reconcilers
    )
    # A call whose reconcile answered (Done, NotDone) has a known outcome now: not interrupted.
    # One an earlier attempt marked (its batch never committed) is as unknown as the rest.
    known = {
        r.tool_call_id for r in records if isinstance(r, ToolOutcome) and r.reconciled is not None
    }
    unknown = [
        t for t in unknown_outcomes(assemble_messages(before)) if t.tool_call_id not in known
    ]
    error = d.error
    if d.signal is not None:
        records.append(
            Signal(
                id=f"{scope.sub.id}:{d.signal}",
                signal_type=d.signal,
                body=(error or {}).get("message", ""),
                attributes={
                    "reason": (error or {}).get("type"),
                    "interrupted_tools": [t.to_json() for t in unknown],
                },
            )
        )
    outcome = "aborted" if d.action is Action.SETTLE_ABORTED else "failed"
    if error is not None and (outcome == "aborted" or "interrupted_tools" in error):
        error = {**error, "interrupted_tools": [t.to_json() for t in unknown]}
    return Settlement(outcome, error=error, records=records)
