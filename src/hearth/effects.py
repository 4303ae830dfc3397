"""Reconciled outcomes: what a tool's ``reconcile`` function is asked and what it answers.

An ordinary tool call cut off by a crash has an unknown outcome. A tool declared with
``@hearth.tool(reconcile=fn)`` lets recovery ask the external system instead of guessing::

    @hearth.tool(reconcile=lambda call: payments.lookup(key=call.tool_call_id))
    async def pay(amount: int, ctx: hearth.ToolContext) -> dict:
        return payments.charge(amount, key=ctx.tool_call_id)   # the key de-duplicates

``fn(call)`` answers ``hearth.Done(result)`` (the effect happened: the call settles with that
result), ``hearth.NotDone()`` (it never happened: the call runs again, once) or ``None`` (unknown:
the call keeps the ``interrupted`` marker). See docs/effects.md for the rules that make it safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DONE = "done"  # the value of ``tool_outcome.reconciled`` when reconcile confirmed the effect
NOT_DONE = "not_done"  # ... when it confirmed that the effect never happened
RECONCILE_TIMEOUT_S = 10.0  # how long recovery waits for a reconcile answer by default


@dataclass(frozen=True)
class ReconcileCall:
    """The interrupted call a ``reconcile`` function is asked about."""

    tool_call_id: str  # the idempotency key the tool gave the external system
    name: str
    arguments: Any  # as the model sent them
    conversation_id: str
    attempt: int  # the attempt that was running the call when it was cut off


class Done:
    """The external system confirms the effect happened: ``Done(result)`` is the call's result;
    ``Done(error="declined")`` (a message or an exception) is its error outcome."""

    __slots__ = ("error", "result")

    def __init__(self, result: Any = None, *, error: str | BaseException | None = None) -> None:
        self.result = result
        self.error = error

    def __repr__(self) -> str:
        if self.error is not None:
            return f"Done(error={self.error!r})"
        return f"Done({self.result!r})"


class NotDone:
    """The external system confirms the effect never happened: the call runs again, once, with
    the same ``tool_call_id`` (at rest — abort, deadline, budget — it gets an error outcome
    saying so instead)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NotDone()"


Answer = Done | NotDone | None  # None: unknown; the call keeps the interrupted marker

__all__ = ["DONE", "NOT_DONE", "RECONCILE_TIMEOUT_S", "Answer", "Done", "NotDone", "ReconcileCall"]
