"""Agents for the disk, power-cut and clock tests (``faultapp:app``), served by ``hearth serve``.

- ``echo`` answers at once;
- ``worker`` calls the durable tool ``chores``: ``$HEARTH_TEST_STEPS`` steps (default 3),
  ``$HEARTH_TEST_STEP_S`` seconds apart (default 0.3);
- ``timed`` calls the ordinary tool ``wait``, which sleeps ``$HEARTH_TEST_WAIT_S`` seconds
  (default 5), under ``Durability(timeout=$HEARTH_TEST_TIMEOUT_S)`` (default 20) and one attempt.

Tools log their executions with ``hearth.testing.toollog.ran`` (for the invariant checker), and
write ``what|conversation|tool_call_id|detail`` lines to ``$HEARTH_TEST_ACKS`` for what the test
must know happened: ``step|…|<name>`` once ``step.do`` *returned* (the step is acknowledged: its
record is committed), ``wait-start``/``wait-done`` around the sleep.
"""

from __future__ import annotations

import asyncio
import os

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply
from hearth.testing.toollog import ran

STEPS = int(os.environ.get("HEARTH_TEST_STEPS", "3"))
STEP_S = float(os.environ.get("HEARTH_TEST_STEP_S", "0.3"))
WAIT_S = float(os.environ.get("HEARTH_TEST_WAIT_S", "5"))
TIMEOUT_S = float(os.environ.get("HEARTH_TEST_TIMEOUT_S", "20"))


def acked(what: str, ctx: hearth.ToolContext, detail: str = "") -> None:
    path = os.environ.get("HEARTH_TEST_ACKS")
    if path:
        with open(path, "a") as f:
            f.write(f"{what}|{ctx.conversation_id}|{ctx.tool_call_id}|{detail}\n")


@hearth.tool(durable=True)
async def chores(ctx: hearth.ToolContext) -> str:
    """Several recorded steps, a moment apart."""
    ran("chores-start", ctx)
    for n in range(STEPS):
        name = f"s{n}"

        def body(name: str = name) -> str:
            ran(f"step-{name}", ctx)
            return name

        await ctx.step.do(name, body)
        acked("step", ctx, name)
        await asyncio.sleep(STEP_S)
    return f"{STEPS} chores"


@hearth.tool
async def wait(ctx: hearth.ToolContext) -> str:
    """Sleep on the event loop (the monotonic clock) for a while."""
    ran("wait", ctx)
    acked("wait-start", ctx)
    await asyncio.sleep(WAIT_S)
    acked("wait-done", ctx)
    return "waited"


def _script(request: ModelRequest) -> Step:
    if request.messages and isinstance(request.messages[-1], ToolResult):
        return reply("job done")
    said = [m.content for m in request.messages if isinstance(m, UserTurn)]
    text = str(said[-1]) if said else ""
    if text.startswith("chores"):
        return calls(call("chores"))
    if text.startswith("wait"):
        return calls(call("wait"))
    return reply(f"echo: {text}")


@hearth.agent
def echo(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/faults")
    return "Repeat the user."


@hearth.agent
def worker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/faults")
    ctx.use_tool(chores)
    return "Do the chores."


@hearth.agent(durability=hearth.Durability(max_attempts=1, timeout=TIMEOUT_S))
def timed(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/faults")
    ctx.use_tool(wait)
    return "Wait, within the time limit."


app = hearth.App([echo, worker, timed], providers=[ScriptedModel("faults", _script)])
