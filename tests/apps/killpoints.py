"""Agents for the kill-point tests: one scenario that reaches every named kill point in-process,
and a real-process app whose model answers with one large batch of tool calls."""

from __future__ import annotations

import asyncio

import hearth
from hearth.agent import MAX_CONTINUATIONS
from hearth.providers.base import ModelRequest, ToolResult
from hearth.runtime.compaction import SUMMARY_PROMPT
from hearth.runtime.hooks import AgentFinish, AgentStart
from hearth.testing import ScriptedModel, Step, call, calls, overflow, reply, stream
from hearth.testing.scenario_apps import answered, last_user_text
from hearth.testing.toollog import ran

FANOUT = 40  # tool calls in the one large completion batch


# --- tools ------------------------------------------------------------------------------------


@hearth.tool
async def lookup(n: int, ctx: hearth.ToolContext) -> str:
    """Look one thing up."""
    ran(f"lookup-{n}", ctx)
    return f"found {n}"


@hearth.tool
async def wait(seconds: float) -> str:
    """Wait a while (heartbeats renew the lease meanwhile)."""
    await asyncio.sleep(seconds)
    return "waited"


@hearth.tool
async def hang() -> str:
    """Never returns: its attempt is aborted or shut down."""
    await asyncio.sleep(3600)
    return "unreachable"


@hearth.tool(durable=True)
async def provision(ctx: hearth.ToolContext) -> str:
    """Two recorded steps."""
    first = await ctx.step.do("reserve", lambda: 1)
    second = await ctx.step.do("confirm", lambda: 2)
    return f"provisioned {first + second}"


@hearth.tool(durable=True)
async def approve(ctx: hearth.ToolContext, timeout: float | None = None) -> str:
    """A durable wait: resolved from outside, or timed out."""
    try:
        return str(await ctx.step.wait("approval", prompt="approve?", timeout=timeout))
    except hearth.WaitTimedOut:
        return "timed out"


# --- agents -----------------------------------------------------------------------------------


@hearth.agent
def helper(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/helper")
    ctx.use_tool(hang)
    return "You help."


@hearth.agent
def lab(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/lab")
    visits, set_visits = ctx.use_state("visits", 0)
    counted, set_counted = ctx.use_state("counted", 0)

    @hearth.tool
    async def count() -> str:
        """Count in persistent state."""
        set_counted(counted + 1)
        return "counted"

    @ctx.on_agent_start
    def started(event: AgentStart) -> None:
        set_visits(visits + 1)

    @ctx.on_agent_finish
    def finished(event: AgentFinish) -> None:
        if event.remaining == MAX_CONTINUATIONS:  # once per submission
            event.append("say more")

    ctx.use_tool(count)
    ctx.use_tool(provision)
    ctx.use_tool(wait)
    ctx.use_tool(hang)
    ctx.use_tool(approve)
    ctx.use_subagent(helper, description="Helps")
    return "You exercise every seam."


def lab_script(request: ModelRequest) -> Step:
    text = last_user_text(request)
    if request.system == SUMMARY_PROMPT:
        return reply("a summary")
    if answered(request):
        return reply("done")
    if text == "tools":
        return calls(call("count"), call("provision"), call("wait", seconds=0.4), text="on it")
    if text == "compact me" and request.summary is None:
        return overflow()
    if text == "hang":
        return calls(call("hang"))
    if text == "approve":
        return calls(call("approve"))
    if text == "approve soon":
        return calls(call("approve", timeout=0.2))
    if text.startswith("delegate"):
        prompt = "help and hang" if text == "delegate and hang" else "help"
        return calls(call("task", agent="helper", prompt=prompt))
    return stream("fine", ", ", "thanks", delay=0.06)


def helper_script(request: ModelRequest) -> Step:
    if answered(request):
        return reply("helped")
    if last_user_text(request) == "help and hang":
        return calls(call("hang"))
    return reply("helped")


def scenario_models() -> list[ScriptedModel]:
    return [ScriptedModel("lab", lab_script), ScriptedModel("helper", helper_script)]


@hearth.agent
def fanout(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/fanout")
    ctx.use_tool(lookup)
    return "You look many things up at once."


def fanout_script(request: ModelRequest) -> Step:
    if answered(request):
        return reply(f"looked up {sum(isinstance(m, ToolResult) for m in request.messages)}")
    return calls(*(call("lookup", n=n) for n in range(FANOUT)), text="looking it all up")


app = hearth.App([fanout], providers=[ScriptedModel("fanout", fanout_script)])
