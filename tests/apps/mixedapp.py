"""One agent whose model picks a behaviour from the message text, for randomised crash tests.
Every tool and step run is logged with ``crashlab.ran`` to $HEARTH_TEST_LOG."""

from __future__ import annotations

import asyncio

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply, stream
from hearth.testing.toollog import ran, trace_points


@hearth.tool
async def fast(ctx: hearth.ToolContext) -> str:
    """Quick."""
    ran("fast", ctx)
    return "fast"


@hearth.tool
async def slow(ctx: hearth.ToolContext) -> str:
    """Slow."""
    ran("slow", ctx)
    await asyncio.sleep(0.2)
    return "slow"


@hearth.tool(durable=True)
async def provision(customer: str, ctx: hearth.ToolContext) -> dict[str, int]:
    """Two steps."""
    ran("provision-start", ctx)

    def one() -> int:
        ran("step-one", ctx)
        return 1

    def two() -> int:
        ran("step-two", ctx)
        return 2

    a = await ctx.step.do("one", one)
    await asyncio.sleep(0.05)
    b = await ctx.step.do("two", two)
    return {"a": a, "b": b}


@hearth.agent
def helper(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/helper")
    ctx.use_tool(fast)
    ctx.use_tool(provision)
    return "You help."


@hearth.agent(durability=hearth.Durability(max_attempts=4, timeout=600))
def mixed(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/mixed")
    ctx.use_tool(fast)
    ctx.use_tool(slow)
    ctx.use_tool(provision)
    ctx.use_subagent(helper, description="Does tool work")
    starts, set_starts = ctx.use_state("starts", 0)

    @ctx.on_agent_start
    def count_start(event: hearth.AgentStart) -> None:
        ran("hook", conversation=event.conversation_id)
        set_starts(starts + 1)

    return "You do a bit of everything."


def script(request: ModelRequest) -> Step:
    if request.messages and isinstance(request.messages[-1], ToolResult):
        return stream("all ", "done", delay=0.01)
    text = next((str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn)), "")
    if text.startswith("tools"):
        return calls(call("fast"), call("provision", customer="c"))
    if text.startswith("slow"):
        return calls(call("slow"), call("fast"))
    if text.startswith("delegate"):
        return calls(call("task", agent="helper", prompt="tools for the helper"))
    if text.startswith("stream"):
        return stream("one ", "two ", "three", delay=0.03)
    return reply("plain")


trace_points()
app = hearth.App(
    [mixed, helper], providers=[ScriptedModel("mixed", script), ScriptedModel("helper", script)]
)
