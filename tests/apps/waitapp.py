"""An app whose durable tool waits for a person (SPEC §15), importable by child processes
(``waitapp:app``) and by in-process tests.

``refund(amount)`` loads the order in a step, asks for approval above 100 (``step.wait``), then
pays in a step. Each step body logs ``step-<name>|conversation|tool_call_id|pid`` to
``$HEARTH_TEST_LOG`` when set, so a test counts executions across killed processes.
``$HEARTH_TEST_WAIT_S`` is the approval's timeout (default: none). The model asks for
``refund`` when told ``refund N``, for ``note`` and ``refund`` at once when told ``both N``, and
for ``approvals`` (two waits in one call) when told ``twice``.
"""

from __future__ import annotations

import os
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply

WAIT_S = float(os.environ["HEARTH_TEST_WAIT_S"]) if os.environ.get("HEARTH_TEST_WAIT_S") else None


def log(what: str, ctx: hearth.ToolContext) -> None:
    path = os.environ.get("HEARTH_TEST_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{what}|{ctx.conversation_id}|{ctx.tool_call_id}|{os.getpid()}\n")


@hearth.tool(durable=True)
async def refund(amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Refund an amount; above 100 a person approves it first."""

    def load() -> str:
        log("step-load", ctx)
        return f"order for {amount}"

    order = await ctx.step.do("load", load)
    approval: Any = "not needed"
    if amount > 100:
        try:
            approval = await ctx.step.wait(
                "approval", prompt=f"Refund {amount} ({order})?", timeout=WAIT_S
            )
        except hearth.WaitTimedOut:
            return {"refunded": 0, "why": "nobody approved in time"}
    if approval is False:
        return {"refunded": 0, "why": "refused"}

    def pay() -> int:
        log("step-pay", ctx)
        return amount

    return {"refunded": await ctx.step.do("pay", pay), "approval": approval}


@hearth.tool(durable=True)
async def approvals(ctx: hearth.ToolContext) -> list[Any]:
    """Ask two people, one after the other."""
    first = await ctx.step.wait("first", prompt="first approval")
    second = await ctx.step.wait("second", prompt="second approval")
    return [first, second]


def script(request: ModelRequest) -> Step:
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResult):
        return reply(f"done: {last.content}")
    text = next((str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn)), "")
    word, _, amount = text.partition(" ")
    if word == "refund":
        return calls(call("refund", amount=int(amount)))
    if word == "both":
        return calls(call("note"), call("refund", amount=int(amount)))
    if word == "twice":
        return calls(call("approvals"))
    if word == "delegate":
        return calls(call("task", agent="cashier", prompt=f"refund {amount}"))
    return reply(f"echo: {text}")


@hearth.agent(durability=hearth.Durability(max_attempts=1, timeout=3600))
def cashier(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/cashier")
    ctx.use_tool(refund)
    ctx.use_tool(approvals)
    notes, set_notes = ctx.use_state("notes", 0)

    @hearth.tool
    async def note(ctx: hearth.ToolContext) -> str:
        """An ordinary call made beside the refund; it counts in persistent state."""
        log("note", ctx)
        set_notes(notes + 1)
        return "noted"

    ctx.use_tool(note)
    return "Refund what you are asked to."


@hearth.agent
def desk(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/cashier")
    ctx.use_subagent(cashier, description="Refunds money")
    return "Delegate refunds."


AGENTS = [cashier, desk]
MODELS = [ScriptedModel("cashier", script)]
app = hearth.App(AGENTS, providers=MODELS)
