"""Agents for the many-process PostgreSQL tests (``pgapp:app``), served by several processes.

Tools log ``what|conversation|tool_call_id|pid`` to $HEARTH_TEST_LOG when they start and finish,
so a test knows which process is running a call (to freeze or kill it) and how often each ran.
``$HEARTH_TEST_TOOL_S`` is how long a tool works (default 30 s: long enough to be interrupted).
"""

from __future__ import annotations

import asyncio
import os

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, ScriptStep, call, calls, reply, stall, stream

TOOL_S = float(os.environ.get("HEARTH_TEST_TOOL_S", "30"))


def ran(what: str, ctx: hearth.ToolContext) -> None:
    with open(os.environ["HEARTH_TEST_LOG"], "a") as f:
        f.write(f"{what}|{ctx.conversation_id}|{ctx.tool_call_id}|{os.getpid()}\n")


@hearth.tool
async def charge(ctx: hearth.ToolContext) -> str:
    """An ordinary call with an effect: never run twice."""
    ran("charge-start", ctx)
    await asyncio.sleep(TOOL_S)
    ran("charge-done", ctx)
    return "charged"


@hearth.tool(durable=True)
async def provision(ctx: hearth.ToolContext) -> str:
    """A durable call: its first step is recorded before it works for a while."""

    def one() -> str:
        ran("step-one", ctx)
        return "one"

    def two() -> str:
        ran("step-two", ctx)
        return "two"

    first = await ctx.step.do("one", one)
    await asyncio.sleep(TOOL_S)
    second = await ctx.step.do("two", two)
    return f"{first}+{second}"


def script(request: ModelRequest) -> ScriptStep:
    if request.messages and isinstance(request.messages[-1], ToolResult):
        return reply("all done")
    text = next((str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn)), "")
    if text.startswith("both"):
        return calls(call("charge"), call("provision"))
    if text.startswith("charge"):
        return calls(call("charge"))
    if text.startswith("provision"):
        return calls(call("provision"))
    if text.startswith("chatty"):
        return stream(*[f"w{i} " for i in range(40)], delay=0.05)
    return reply(f"echo: {text}")


@hearth.agent
def jobs(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/jobs")
    ctx.use_tool(charge)
    ctx.use_tool(provision)
    return "Do the job."


@hearth.agent
def staller(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/stall")
    return "Never finish."


app = hearth.App(
    [jobs, staller],
    providers=[ScriptedModel("jobs", script), ScriptedModel("stall", [stall()], repeat_last=True)],
)
