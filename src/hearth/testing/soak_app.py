"""The agents the random soak (``python -m hearth.testing.soak``) serves: ``hearth serve
hearth.testing.soak_app:app``.

The scripted model picks what to do from the first word of the latest user message, so the soak
chooses each submission's scenario by its text (``SCENARIOS``). Every tool body, durable step and
hook logs itself with ``hearth.testing.toollog.ran`` to ``$HEARTH_TEST_LOG``, and every kill point
reached goes to ``$HEARTH_TRACE_POINTS`` (when set), from which the soak draws its next kill.

Agents: ``soak`` (everything), ``brittle`` (``max_attempts=1``: one kill during an attempt
exhausts its budget), ``hurried`` (a 4 s deadline: ``stall`` times out) and ``helper`` (the
subagent behind ``delegate``, which itself delegates to ``grandhelper`` on ``deep``).
"""

from __future__ import annotations

import asyncio

import hearth
from hearth.agent import MAX_CONTINUATIONS
from hearth.providers.base import AssistantTurn, ModelRequest, SystemNote, ToolResult, UserTurn
from hearth.runtime.compaction import SUMMARY_PROMPT
from hearth.testing.scripted import (
    ScriptedModel,
    ScriptStep,
    call,
    calls,
    error,
    overflow,
    reply,
    stall,
    stream,
)
from hearth.testing.toollog import ran, trace_points

# What a message's first word asks for (the soak draws from these).
SCENARIOS = (
    "plain",  # a one-chunk reply
    "stream",  # many text deltas: heavy append traffic
    "tools",  # an ordinary and a durable tool in one batch
    "slow",  # a slow ordinary tool next to a quick one (aborts and joins land here)
    "delegate",  # a subagent task whose child runs tools
    "deep",  # a subagent task whose child delegates again (a grandchild)
    "transient",  # one transient provider error, then a reply
    "overflow",  # a context overflow: compaction, then a reply
    "fatal",  # a permanent provider error: failed with provider_error
    "finish",  # the finish hook continues the response once and writes state
    "stall",  # the model hangs: only a deadline or an abort ends it
)


@hearth.tool
async def fast(ctx: hearth.ToolContext) -> str:
    """Quick."""
    ran("fast", ctx)
    return "fast"


@hearth.tool
async def slow(ctx: hearth.ToolContext) -> str:
    """Takes a while."""
    ran("slow", ctx)
    await asyncio.sleep(0.4)
    return "slow"


@hearth.tool(durable=True)
async def provision(customer: str, ctx: hearth.ToolContext) -> dict[str, int]:
    """Two recorded steps with a pause between them."""
    ran("provision-start", ctx)

    def one() -> int:
        ran("step-one", ctx)
        return 1

    async def two() -> int:
        ran("step-two", ctx)
        await asyncio.sleep(0.01)
        return 2

    a = await ctx.step.do("one", one)
    await asyncio.sleep(0.05)
    b = await ctx.step.do("two", two)
    return {"a": a, "b": b}


def _last_user(request: ModelRequest) -> tuple[int, str]:
    for i in range(len(request.messages) - 1, -1, -1):
        m = request.messages[i]
        if isinstance(m, UserTurn):
            return i, str(m.content)
    return -1, ""


def _failed_since(request: ModelRequest, index: int) -> bool:
    """Whether a turn after the message at ``index`` ended in an error or was cut."""
    return any(isinstance(m, AssistantTurn) and m.aborted for m in request.messages[index + 1 :])


def _ids(request: ModelRequest, *made: tuple[str, dict[str, str]]) -> ScriptStep:
    """Calls (name, arguments) with ids unique in the conversation even after a compaction dropped
    earlier turns (the scripted default numbers them by the turns in view): the message's key
    and the number of turns since it."""
    index, text = _last_user(request)
    key = text.rsplit(" ", 1)[-1].replace(" ", "-")
    turns = sum(1 for m in request.messages[index + 1 :] if isinstance(m, AssistantTurn))
    return calls(
        *(call(name, args, id=f"{key}.{turns}.{k}") for k, (name, args) in enumerate(made))
    )


def script(request: ModelRequest) -> ScriptStep:
    if request.system == SUMMARY_PROMPT:
        return reply("summary of earlier talk")
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResult):
        return stream("all ", "done", delay=0.005)
    if isinstance(last, SystemNote) and last.kind != "compaction":
        return reply("continued")
    index, text = _last_user(request)
    word = text.split(" ", 1)[0]
    if word == "tools":
        return _ids(request, ("fast", {}), ("provision", {"customer": "c"}))
    if word == "slow":
        return _ids(request, ("slow", {}), ("fast", {}))
    if word == "delegate":
        return _ids(request, ("task", {"agent": "helper", "prompt": "tools for the helper"}))
    if word == "deep":
        return _ids(request, ("task", {"agent": "helper", "prompt": "deep work"}))
    if word == "stream":
        return stream(*[f"w{i} " for i in range(60)], delay=0.004)
    if word == "transient" and not _failed_since(request, index):
        # with a partial: an error turn with no text is not shown to the model again
        return error("transient", "scripted overload", status=529, after_chunks=["partial "])
    if word == "overflow" and not _failed_since(request, index) and request.summary is None:
        return overflow()
    if word == "fatal":
        return error("terminal", "scripted permanent refusal", status=400)
    if word == "stall":
        return stall(["thinking "])
    return reply(f"ok {word}")


def helper_script(request: ModelRequest) -> ScriptStep:
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResult):
        return reply("helper done")
    _, text = _last_user(request)
    if text.startswith("deep"):
        return calls(call("task", agent="grandhelper", prompt="tools for the grandchild"))
    return calls(call("fast"), call("provision", customer="h"))


def _declare(ctx: hearth.AgentContext, model: str) -> None:
    ctx.use_model(model)
    ctx.use_tool(fast)
    ctx.use_tool(slow)
    ctx.use_tool(provision)
    ctx.use_subagent(helper, description="Does tool work")
    starts, set_starts = ctx.use_state("starts", 0)
    finishes, set_finishes = ctx.use_state("finishes", 0)

    @ctx.on_agent_start
    def count_start(event: hearth.AgentStart) -> None:
        ran("hook", conversation=event.conversation_id)
        set_starts(starts + 1)

    @ctx.on_agent_finish
    def continue_once(event: hearth.AgentFinish) -> None:
        text = event.input if isinstance(event.input, str) else ""
        if text.startswith("finish") and event.remaining == MAX_CONTINUATIONS:
            ran("hook", conversation=event.conversation_id)
            set_finishes(finishes + 1)
            event.append("add one more line")


@hearth.agent
def grandhelper(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/helper")
    ctx.use_tool(fast)
    ctx.use_tool(provision)
    return "You help the helper."


@hearth.agent
def helper(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/helper")
    ctx.use_tool(fast)
    ctx.use_tool(provision)
    ctx.use_subagent(grandhelper, description="Helps the helper")
    return "You help."


@hearth.agent(durability=hearth.Durability(max_attempts=8, timeout=600))
def soak(ctx: hearth.AgentContext) -> str:
    _declare(ctx, "scripted/soak")
    return "You do a bit of everything."


@hearth.agent(durability=hearth.Durability(max_attempts=1, timeout=600))
def brittle(ctx: hearth.AgentContext) -> str:
    _declare(ctx, "scripted/soak")
    return "One attempt only."


@hearth.agent(durability=hearth.Durability(max_attempts=8, timeout=4.0))
def hurried(ctx: hearth.AgentContext) -> str:
    _declare(ctx, "scripted/soak")
    return "You are in a hurry."


# The agents a soak conversation may belong to, and the tools' and steps' names (for the
# ``tool:<name>`` style kill points).
TOP_AGENTS = ("soak", "brittle", "hurried")
TOOLS = ("fast", "slow", "provision")
STEPS = ("one", "two")

trace_points()
app = hearth.App(
    [soak, brittle, hurried, helper, grandhelper],
    providers=[ScriptedModel("soak", script), ScriptedModel("helper", helper_script)],
)
