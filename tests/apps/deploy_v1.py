"""Version 1 of an app that a deploy changes (``deploy_v1:app``); ``deploy_v2`` is version 2.

Every tool blocks after its first step (or wait), so a test can leave work in flight and then
ask ``hearth check`` what version 2 would do to it. The first word of a message picks the call:
``ship`` and ``bill`` (durable), ``keep`` (durable in both versions), ``ask`` (a durable wait),
``lookup`` (ordinary), ``delegate`` (a task to ``packer``). The agent ``legacy`` stalls.
"""

from __future__ import annotations

import asyncio

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply, stall

FOREVER_S = 3600.0


def _script(request: ModelRequest) -> Step:
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResult):
        return reply("done")
    word = str(last.content if isinstance(last, UserTurn) else "").split(" ")[0]
    if word == "delegate":
        return calls(call("task", agent="packer", prompt="pack it"))
    if word in ("ship", "bill", "keep", "ask", "lookup"):
        return calls(call(word))
    return reply(f"echo: {word}")


def _packer(request: ModelRequest) -> Step:
    last = request.messages[-1] if request.messages else None
    return reply("packed") if isinstance(last, ToolResult) else calls(call("pack"))


MODELS = [
    ScriptedModel("shop", _script),
    ScriptedModel("packer", _packer),
    ScriptedModel("legacy", [stall()], repeat_last=True),
]


async def _step_then_block(ctx: hearth.ToolContext, name: str) -> str:
    await ctx.step.do(name, lambda: f"{name} started")
    await asyncio.sleep(FOREVER_S)
    return name


@hearth.tool(durable=True)
async def ship(ctx: hearth.ToolContext) -> str:
    """Ship the order."""
    return await _step_then_block(ctx, "label")


@hearth.tool(durable=True)
async def bill(ctx: hearth.ToolContext) -> str:
    """Bill the customer."""
    return await _step_then_block(ctx, "invoice")


@hearth.tool(durable=True)
async def keep(ctx: hearth.ToolContext) -> str:
    """A durable tool both versions keep."""
    return await _step_then_block(ctx, "kept")


@hearth.tool(durable=True)
async def ask(ctx: hearth.ToolContext) -> str:
    """Ask a human for approval."""
    approved = await ctx.step.wait("approval", prompt="ship it?")
    return f"approved: {approved}"


@hearth.tool
async def lookup() -> str:
    """Look something up (ordinary)."""
    await asyncio.sleep(FOREVER_S)
    return "found"


@hearth.tool(durable=True)
async def pack(ctx: hearth.ToolContext) -> str:
    """Pack the parcel."""
    return await _step_then_block(ctx, "box")


@hearth.agent
def packer(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/packer")
    ctx.use_tool(pack)
    return "Pack parcels."


@hearth.agent
def shop(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/shop")
    for tool in (ship, bill, keep, ask, lookup):
        ctx.use_tool(tool)
    ctx.use_subagent(packer, description="Packs parcels")
    return "Run the shop."


@hearth.agent
def legacy(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/legacy")
    return "An agent version 2 drops."


app = hearth.App([shop, legacy, packer], providers=MODELS)
