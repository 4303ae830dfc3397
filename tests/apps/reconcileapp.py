"""Agents for the reconcile crash tests (``reconcileapp:app``): tools whose effect lands in a
ledger keyed by the tool call id (``$LEDGER_DIR``), each with a reconcile function that asks the
ledger — or that raises, hangs or answers garbage. Each tool body logs ``ran(name)``."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import hearth
from hearth.providers.base import AssistantTurn, ModelRequest, ToolResult, UserTurn
from hearth.testing import Ledger, ScriptedModel, ScriptStep, call, calls, reply
from hearth.testing.toollog import ran


def ledger() -> Ledger:
    return Ledger(os.environ["LEDGER_DIR"])


def paid(call: hearth.ReconcileCall) -> hearth.Done | hearth.NotDone:
    """Ask the ledger about the call's key: the real answer."""
    entry = ledger().get(call.tool_call_id)
    return hearth.NotDone() if entry is None else hearth.Done(entry)


def raises(call: hearth.ReconcileCall) -> Any:
    raise RuntimeError(f"the ledger is down (asked about {call.tool_call_id})")


async def hangs(call: hearth.ReconcileCall) -> Any:
    await asyncio.sleep(60)


def garbage(call: hearth.ReconcileCall) -> Any:
    return "probably"


async def pay_body(name: str, amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    ran(name, ctx)
    await asyncio.sleep(float(os.environ.get("PAY_S", "0")))
    ledger().record(ctx.tool_call_id, {"paid": amount})
    return {"paid": amount}


@hearth.tool(reconcile=paid)
async def pay(amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Pay, keyed by the call id."""
    return await pay_body("pay", amount, ctx)


@hearth.tool(reconcile=paid)
def pay_sync(amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Pay on a worker thread, keyed by the call id."""
    ran("pay_sync", ctx)
    time.sleep(float(os.environ.get("PAY_S", "0")))  # on a worker thread: cannot be cancelled
    ledger().record(ctx.tool_call_id, {"paid": amount})
    return {"paid": amount}


@hearth.tool(reconcile=raises)
async def pay_raises(amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Pay; its reconcile raises."""
    return await pay_body("pay_raises", amount, ctx)


@hearth.tool(reconcile=hangs, reconcile_timeout=0.5)
async def pay_hangs(amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Pay; its reconcile never answers."""
    return await pay_body("pay_hangs", amount, ctx)


@hearth.tool(reconcile=garbage)
async def pay_garbage(amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Pay; its reconcile answers neither Done nor NotDone."""
    return await pay_body("pay_garbage", amount, ctx)


TOOLS = [pay, pay_sync, pay_raises, pay_hangs, pay_garbage]


def script(request: ModelRequest) -> ScriptStep:
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResult):
        kind = (
            last.content.get("type") if last.is_error and isinstance(last.content, dict) else "ok"
        )
        return reply(f"saw {last.name}={kind} {json.dumps(last.content, sort_keys=True)}")
    text = next((str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn)), "")
    words = text.split()
    name = words[0] if words else ""
    if any(t.name == name for t in TOOLS):
        # "pay k": the call's id names k (and the turn: a cut-off reply makes the model call
        # again), so that ledger keys differ across conversations
        turn = sum(isinstance(m, AssistantTurn) for m in request.messages)
        made = f"{name}-{words[1]}-t{turn}" if len(words) > 1 else None
        return calls(call(name, id=made, amount=5))
    return reply(f"echo: {text}")


@hearth.agent(durability=hearth.Durability(max_attempts=10, timeout=600))
def payer(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/payer")
    for t in TOOLS:
        ctx.use_tool(t)
    return "You pay."


def lead_script(request: ModelRequest) -> ScriptStep:
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResult):
        return reply(f"lead saw {json.dumps(last.content, sort_keys=True)}")
    return calls(call("task", agent="payer", prompt="pay"))


@hearth.agent(durability=hearth.Durability(max_attempts=10, timeout=600))
def lead(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/lead")
    ctx.use_subagent(payer, description="Pays what it is asked to pay.")
    return "You delegate."


async def paid_late(call: hearth.ReconcileCall) -> hearth.Done | hearth.NotDone:
    """``paid``, after ``$RECONCILE_S`` seconds."""
    await asyncio.sleep(float(os.environ.get("RECONCILE_S", "0")))
    return paid(call)


@hearth.tool(reconcile=paid_late)
async def pay_late(amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Pay, keyed by the call id; its reconcile answers late."""
    return await pay_body("pay_late", amount, ctx)


def keeper_script(request: ModelRequest) -> ScriptStep:
    if isinstance(request.messages[-1], ToolResult):
        return reply("kept")
    text = next((str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn)), "")
    if text == "jot":  # an ordinary call that writes state, beside a durable one
        return calls(call("jot", id="c-jot"), call("remember", id="c-remember", note="n1"))
    return calls(
        call("remember", id="c-remember", note="n1"), call("pay_late", id="c-pay", amount=5)
    )


@hearth.agent(durability=hearth.Durability(max_attempts=10, timeout=600))
def keeper(ctx: hearth.AgentContext) -> str:
    """Remembers a note in its state, and pays (or jots), in one batch."""
    ctx.use_model("scripted/keeper")
    notes, set_notes = ctx.use_state("notes", [])
    _, set_jotted = ctx.use_state("jotted", False)

    @hearth.tool
    def jot() -> str:
        """Jot something down (an ordinary tool writing state)."""
        set_jotted(True)
        return "jotted"

    @hearth.tool(durable=True)
    async def remember(note: str, ctx: hearth.ToolContext) -> dict[str, Any]:
        """Remember a note; it takes ``$REMEMBER_S`` seconds."""
        await ctx.step.do("check", lambda: True)
        set_notes([*notes, note])
        await asyncio.sleep(float(os.environ.get("REMEMBER_S", "0")))
        return {"remembered": note}

    ctx.use_tool(remember)
    ctx.use_tool(pay_late)
    ctx.use_tool(jot)
    return f"notes: {json.dumps(notes)}"


app = hearth.App(
    [payer, lead, keeper],
    providers=[
        ScriptedModel("payer", script),
        ScriptedModel("lead", lead_script),
        ScriptedModel("keeper", keeper_script),
    ],
)
