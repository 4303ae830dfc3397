"""Agents for the console's browser tests, importable by ``hearth serve consoleapp:app``.

``chores`` runs a durable tool with two steps and settles in well under a second. ``holder``
calls ``hold``, an ordinary tool that sleeps ``$HEARTH_TEST_HOLD_S`` seconds (default 60): a
SIGKILL meanwhile leaves the call interrupted, and the recovery attempt tells the model so.
``boss`` delegates to ``chores``, whose start hook counts visits in its state. ``notes`` makes
ten quick tool calls for each message: long conversations, fast. ``talker`` streams its answer
slowly, for a SIGKILL to cut off. ``hoarder`` keeps about 4.5 MB of step values when told to
``hoard`` (more than a JSON page holds; no model request carries them); ``rambler`` answers
in 450 pieces (each a record with ``$HEARTH_TEST_EACH_DELTA``). ``approver`` asks a
person before it refunds (a durable wait), and the ``hooks`` channel routes a signed webhook to
``chores``.
"""

from __future__ import annotations

import asyncio
import os

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.runtime import deltas
from hearth.testing import ScriptedModel, Step, call, calls, reply, stream

HOLD_S = float(os.environ.get("HEARTH_TEST_HOLD_S", "60"))
if os.environ.get("HEARTH_TEST_EACH_DELTA"):  # every piece of an answer a record of its own
    deltas.FLUSH_INTERVAL_S = 0.0


@hearth.tool(durable=True)
async def tidy(ctx: hearth.ToolContext, room: str) -> str:
    """Tidy a room in two durable steps."""
    await ctx.step.do("sweep", lambda: f"swept the {room}")
    await asyncio.sleep(0.2)
    await ctx.step.do("dust", lambda: f"dusted the {room}")
    return f"the {room} is tidy"


@hearth.tool
async def hold(seconds: float = HOLD_S) -> str:
    """Wait a long time (an ordinary tool: its outcome is unknown if the process dies)."""
    await asyncio.sleep(seconds)
    return "held"


def _result(request: ModelRequest) -> ToolResult | None:
    """The tool result answering the latest user turn (recovery notes may follow it)."""
    for message in reversed(request.messages):
        if isinstance(message, ToolResult):
            return message
        if isinstance(message, UserTurn):
            return None
    return None


def _chores(request: ModelRequest) -> Step:
    done = _result(request)
    if done is not None:
        return reply(f"Done: {done.content}.")
    said = [m.content for m in request.messages if isinstance(m, UserTurn)]
    return calls(call("tidy", room=str(said[-1]) if said else "kitchen"))


def _holder(request: ModelRequest) -> Step:
    done = _result(request)
    if done is not None:
        return reply(f"The hold ended: {done.content}")
    return calls(call("hold"))


@hearth.tool(durable=True)
async def refund(ctx: hearth.ToolContext, amount: int) -> str:
    """Refund an amount once a person approves it."""
    approved = await ctx.step.wait("approval", prompt={"question": f"refund {amount}?"})
    return f"refunded {amount}" if approved is True else f"not refunded ({approved!r})"


def _approver(request: ModelRequest) -> Step:
    done = _result(request)
    if done is not None:
        return reply(f"Refund: {done.content}.")
    return calls(call("refund", amount=250))


def _route(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
    return [hearth.Dispatch("chores", str(delivery.data["house"]), message=delivery.data["room"])]


HOOK_SECRET = "console-hook-secret"


@hearth.tool
async def jot(line: int) -> str:
    """Write one line of a note."""
    return f"line {line}"


def _notes(request: ModelRequest) -> Step:
    if _result(request) is not None:
        return reply("noted")
    return calls(*[call("jot", line=n) for n in range(10)])  # 25 records a message


@hearth.tool(durable=True)
async def hoard(ctx: hearth.ToolContext) -> str:
    """Keep five large values as steps."""
    for n in range(5):
        await ctx.step.do(f"part{n}", lambda n=n: str(n) * 900_000)
    return "hoarded"


def _hoarder(request: ModelRequest) -> Step:
    if _result(request) is not None:
        return reply("kept")
    said = [m.content for m in request.messages if isinstance(m, UserTurn)]
    return calls(call("hoard")) if said and said[-1] == "hoard" else reply("noted")


def _boss(request: ModelRequest) -> Step:
    done = _result(request)
    if done is not None:
        return reply(f"The helper says: {done.content}")
    return calls(call("task", agent="chores", prompt="study"))


MODELS = [
    ScriptedModel("chores", _chores),
    ScriptedModel("holder", _holder),
    ScriptedModel("notes", _notes),
    ScriptedModel("boss", _boss),
    ScriptedModel("approver", _approver),
    ScriptedModel("hoarder", _hoarder),
    # 450 words at once: one answer over three pages of the console.
    ScriptedModel("rambler", [stream(*[f"w{n} " for n in range(450)])], repeat_last=True),
    # 60 words, 50 ms apart: three seconds of streaming to cut off.
    ScriptedModel(
        "talker", [stream(*[f"word{n} " for n in range(60)], delay=0.05)], repeat_last=True
    ),
]


@hearth.agent
def chores(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/chores")
    ctx.use_tool(tidy)
    visits, set_visits = ctx.use_state("visits", 0)

    @ctx.on_agent_start
    async def count_visit(event: hearth.AgentStart) -> None:
        set_visits(visits + 1)

    return "Do the chores you are asked to do."


@hearth.agent
def boss(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/boss")
    ctx.use_subagent(chores, description="Does chores")
    return "Delegate the chores."


@hearth.agent
def holder(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/holder")
    ctx.use_tool(hold)
    return "Hold on."


@hearth.agent
def notes(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/notes")
    ctx.use_tool(jot)
    return "Take notes."


@hearth.agent
def talker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/talker")
    return "Talk slowly."


@hearth.agent
def approver(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/approver")
    ctx.use_tool(refund)
    return "Refund what is asked, once approved."


@hearth.agent
def hoarder(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/hoarder")
    ctx.use_tool(hoard)
    return "Keep what you are given."


@hearth.agent
def rambler(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/rambler")
    return "Ramble."


AGENTS = [chores, holder, notes, boss, talker, approver, hoarder, rambler]
HOOKS = hearth.Channel("hooks", verify=hearth.channels.hmac(HOOK_SECRET), receive=_route)
app = hearth.App(AGENTS, providers=MODELS, channels=[HOOKS])
