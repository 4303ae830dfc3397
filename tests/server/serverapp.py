"""Agents for the HTTP tests, importable by child processes (``serverapp:app``).

``$HEARTH_TEST_SLOW_S`` is how long ``slow_job`` sleeps between its two steps (default 2 s);
``$HEARTH_TEST_CHUNKS`` how many 50 ms chunks ``streamer`` streams (default 40).
"""

from __future__ import annotations

import asyncio
import os

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply, stall, stream

SLOW_S = float(os.environ.get("HEARTH_TEST_SLOW_S", "2"))
CHUNKS = int(os.environ.get("HEARTH_TEST_CHUNKS", "40"))


def _said(content: object) -> str:
    """A user turn as text: attachments by name (their bytes are in the request too)."""
    if not isinstance(content, list):
        return str(content)
    return " ".join(
        str(p.get("text", "")) if isinstance(p, dict) else f"[{getattr(p, 'name', p)}]"
        for p in content
    )


def _echo(request: ModelRequest) -> Step:
    said = [_said(m.content) for m in request.messages if isinstance(m, UserTurn)]
    return reply(f"echo: {said[-1] if said else ''}")


@hearth.tool(durable=True)
async def slow_job(ctx: hearth.ToolContext) -> str:
    """Start, wait a while, finish."""
    await ctx.step.do("start", lambda: "started")
    await asyncio.sleep(SLOW_S)
    await ctx.step.do("finish", lambda: "finished")
    return "done"


MODELS = [
    ScriptedModel("echo", _echo),
    ScriptedModel(
        "streamer",
        [stream(*[f"w{i} " for i in range(CHUNKS)], delay=0.05), reply("recovered")],
        repeat_last=True,
    ),
    ScriptedModel("stall", [stall()], repeat_last=True),
    ScriptedModel("worker", [calls(call("slow_job")), reply("job done")], repeat_last=True),
    ScriptedModel("later", [stream("a", "b", delay=0.3)], repeat_last=True),
]


@hearth.agent
def echo(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/echo")
    return "Repeat the user."


@hearth.agent
def streamer(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/streamer")
    return "Talk slowly."


@hearth.agent
def staller(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/stall")
    return "Never finish."


@hearth.agent
def worker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/worker")
    ctx.use_tool(slow_job)
    return "Run the job."


@hearth.agent
def later(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/later")
    return "Answer after a moment."


def _delegate(request: ModelRequest) -> Step:
    last = request.messages[-1]
    if isinstance(last, ToolResult):
        return reply(f"the echo agent said: {last.content}")
    return calls(call("task", agent="echo", prompt="hello from the parent"))


MODELS.append(ScriptedModel("delegator", _delegate))


@hearth.agent
def delegator(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/delegator")
    ctx.use_subagent(echo, description="Repeats what it is told")
    return "Delegate to echo."


AGENTS = [echo, streamer, staller, worker, later, delegator]
app = hearth.App(AGENTS, providers=MODELS)
