"""The agents the kill-point scenarios run (``hearth.testing.scenarios``), in one App.

Each agent plays one situation with a scripted model whose answer depends only on the
conversation (and, for the transient error, on what this process already saw), so a clean run and
a run killed at any point take the same path up to the kill. Every tool body and step logs itself
with ``ran`` (``$HEARTH_TEST_LOG``), and importing this module turns on the kill-point trace
(``$HEARTH_TRACE_POINTS``) when that variable is set.

Example::

    harness = CrashHarness("hearth.testing.scenario_apps:app", db=path, env=...)
    harness.run(dispatch=[("parallel", "p1", "look up")])
"""

from __future__ import annotations

import asyncio

import hearth
from hearth.agent import MAX_CONTINUATIONS
from hearth.providers.base import AssistantTurn, ModelRequest, ToolResult, UserTurn
from hearth.runtime.compaction import SUMMARY_PROMPT
from hearth.runtime.hooks import AgentFinish, AgentStart
from hearth.testing.scripted import ScriptedModel, Step, call, calls, error, overflow, reply
from hearth.testing.toollog import ran, trace_points

PAUSE_S = 0.6  # how long ``pause`` runs: long enough for a join, an abort or a shutdown to land


def last_user_text(request: ModelRequest) -> str:
    for m in reversed(request.messages):
        if isinstance(m, UserTurn):
            return str(m.content)
    return ""


def answered(request: ModelRequest) -> bool:
    """Whether a tool result came after the latest user message."""
    for m in reversed(request.messages):
        if isinstance(m, ToolResult):
            return True
        if isinstance(m, UserTurn):
            return False
    return False


# --- tools ------------------------------------------------------------------------------------


@hearth.tool
async def lookup(n: int, ctx: hearth.ToolContext) -> str:
    """Look one thing up."""
    ran("lookup", ctx)
    return f"found {n}"


@hearth.tool
async def pause(ctx: hearth.ToolContext) -> str:
    """Take a while (a join, an abort or a shutdown arrives meanwhile)."""
    ran("pause", ctx)
    await asyncio.sleep(PAUSE_S)
    return "paused"


@hearth.tool(durable=True)
async def provision(customer: str, ctx: hearth.ToolContext) -> str:
    """Three recorded steps, with a wait between two of them (heartbeats renew meanwhile)."""
    ran("provision-start", ctx)

    def step(name: str, value: int) -> int:
        ran(f"step-{name}", ctx)
        return value

    a = await ctx.step.do("reserve", lambda: step("reserve", 1))
    await asyncio.sleep(PAUSE_S)
    b = await ctx.step.do("charge", lambda: step("charge", 2))
    c = await ctx.step.do("confirm", lambda: step("confirm", 3))
    return f"provisioned {customer}: {a + b + c}"


APPROVAL_S = 0.3  # how long ``approve`` waits for an approval nobody sends


@hearth.tool(durable=True)
async def approve(ctx: hearth.ToolContext) -> str:
    """A step, a durable wait that times out, another step."""
    ran("approve-start", ctx)

    def step(name: str) -> str:
        ran(f"step-{name}", ctx)
        return name

    await ctx.step.do("prepare", lambda: step("prepare"))
    try:
        answer = await ctx.step.wait("approval", prompt="approve?", timeout=APPROVAL_S)
    except hearth.WaitTimedOut:
        answer = "no answer"
    await ctx.step.do("finish", lambda: step("finish"))
    return f"approval: {answer}"


# --- agents -----------------------------------------------------------------------------------


@hearth.agent
def parallel(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/parallel")
    ctx.use_tool(lookup)
    return "You look several things up at once."


@hearth.agent
def durable(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/durable")
    ctx.use_tool(provision)
    return "You provision tenants."


@hearth.agent
def grandchild(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/grandchild")
    ctx.use_tool(lookup)
    return "You do the actual work."


@hearth.agent
def child(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/child")
    ctx.use_subagent(grandchild, description="Does the work")
    return "You pass the work on."


@hearth.agent
def parent(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/parent")
    ctx.use_subagent(child, description="Organises the work")
    return "You delegate."


@hearth.agent
def hooks(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/hooks")
    visits, set_visits = ctx.use_state("visits", 0)
    counted, set_counted = ctx.use_state("counted", 0)

    @hearth.tool
    async def count(ctx: hearth.ToolContext) -> str:
        """Count in persistent state."""
        ran("count", ctx)
        set_counted(counted + 1)
        return "counted"

    @ctx.on_agent_start
    def started(event: AgentStart) -> None:
        ran("hook", conversation=event.conversation_id)
        set_visits(visits + 1)

    @ctx.on_agent_finish
    def finished(event: AgentFinish) -> None:
        ran("hook", conversation=event.conversation_id)
        if event.remaining == MAX_CONTINUATIONS:  # continue once per submission
            event.append("say more")

    ctx.use_tool(count)
    return "You keep count."


@hearth.agent
def pausing(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/pausing")
    ctx.use_tool(pause)
    return "You take your time."


@hearth.agent
def approving(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/approving")
    ctx.use_tool(approve)
    return "You ask before you act."


@hearth.agent
def flaky(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/flaky")
    return "Your provider stumbles."


@hearth.agent
def compacting(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/compacting")
    ctx.use_tool(lookup)
    return "Your context fills up."


# --- scripts ----------------------------------------------------------------------------------


def parallel_script(request: ModelRequest) -> Step:
    if last_user_text(request) == "look up" and not answered(request):
        return calls(*(call("lookup", n=n) for n in range(3)), text="looking")
    return reply("all found" if answered(request) else "nothing to look up")


def durable_script(request: ModelRequest) -> Step:
    if last_user_text(request) == "provision" and not answered(request):
        return calls(call("provision", customer="acme"))
    return reply("provisioned" if answered(request) else "ok")


def parent_script(request: ModelRequest) -> Step:
    if last_user_text(request) == "delegate" and not answered(request):
        return calls(call("task", agent="child", prompt="pass it on"))
    return reply("delegated" if answered(request) else "ok")


def child_script(request: ModelRequest) -> Step:
    if last_user_text(request) == "pass it on" and not answered(request):
        return calls(call("task", agent="grandchild", prompt="do it"))
    return reply("passed on")


def grandchild_script(request: ModelRequest) -> Step:
    if answered(request):
        return reply("done it")
    return calls(call("lookup", n=7))


def hooks_script(request: ModelRequest) -> Step:
    if last_user_text(request) == "count" and not answered(request):
        return calls(call("count"))
    return reply("noted")


def pausing_script(request: ModelRequest) -> Step:
    if last_user_text(request) == "pause" and not answered(request):
        return calls(call("pause"), text="pausing")
    return reply("resumed" if answered(request) else "ok")


def approving_script(request: ModelRequest) -> Step:
    if last_user_text(request) == "approve" and not answered(request):
        return calls(call("approve"))
    return reply("approved" if answered(request) else "ok")


_stumbled: set[int] = set()  # the user turns (by their count) this process already failed


def flaky_script(request: ModelRequest) -> Step:
    # A transient error on the first try of each turn in this process, then an answer.
    turn = sum(isinstance(m, UserTurn) for m in request.messages)
    if last_user_text(request) == "stumble" and turn not in _stumbled:
        _stumbled.add(turn)
        return error("transient", "overloaded", status=529, retry_after=0.0)
    return reply("recovered")


def compacting_script(request: ModelRequest) -> Step:
    if request.system == SUMMARY_PROMPT:
        return reply("a summary")
    if last_user_text(request) != "fill up":
        return reply("ok")
    if not answered(request):
        return calls(call("lookup", n=1))
    if request.summary is None:
        return overflow()
    turns = sum(isinstance(m, AssistantTurn) for m in request.messages)
    return reply(f"compacted after {turns} turns")


trace_points()
app = hearth.App(
    [parallel, durable, parent, child, grandchild, hooks, pausing, flaky, compacting, approving],
    providers=[
        ScriptedModel("parallel", parallel_script),
        ScriptedModel("durable", durable_script),
        ScriptedModel("parent", parent_script),
        ScriptedModel("child", child_script),
        ScriptedModel("grandchild", grandchild_script),
        ScriptedModel("hooks", hooks_script),
        ScriptedModel("pausing", pausing_script),
        ScriptedModel("flaky", flaky_script),
        ScriptedModel("compacting", compacting_script),
        ScriptedModel("approving", approving_script),
    ],
)
