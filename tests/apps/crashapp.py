"""Agents for the crash tests. Each tool and step appends a line to $HEARTH_TEST_LOG when it
runs, so a test can count executions across killed processes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.runtime import model_turn
from hearth.testing import ScriptedModel, Step, call, calls, reply, stall, stream
from hearth.testing.toollog import ran


def last_user_text(request: ModelRequest) -> str:
    for m in reversed(request.messages):
        if isinstance(m, UserTurn):
            return str(m.content)
    return ""


def last_result(request: ModelRequest) -> ToolResult | None:
    last = request.messages[-1] if request.messages else None
    return last if isinstance(last, ToolResult) else None


def results_summary(request: ModelRequest) -> str:
    """Reply text naming what each tool result the model saw said."""
    seen = []
    for m in request.messages:
        if isinstance(m, ToolResult):
            kind = m.content.get("type") if m.is_error and isinstance(m.content, dict) else "ok"
            seen.append(f"{m.name}={kind}")
    return "saw " + ",".join(seen)


# --- tools ------------------------------------------------------------------------------------


@hearth.tool
async def charge(amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Charge the customer."""
    ran("charge", ctx)
    await asyncio.sleep(0.05)
    return {"charged": amount}


@hearth.tool
async def fast(ctx: hearth.ToolContext) -> str:
    """A quick lookup."""
    ran("fast", ctx)
    return "fast done"


@hearth.tool
async def slow(ctx: hearth.ToolContext) -> str:
    """A slow lookup."""
    ran("slow", ctx)
    await asyncio.sleep(float(os.environ.get("SLOW_S", "5")))
    return "slow done"


@hearth.tool(durable=True)
async def provision(customer: str, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Create a tenant in two steps."""
    ran("provision-start", ctx)

    async def expensive() -> int:
        ran("step-expensive", ctx)
        await asyncio.sleep(0.05)
        return 123123123

    value = await ctx.step.do("expensive", expensive)
    await asyncio.sleep(float(os.environ.get("BETWEEN_S", "0.2")))

    def save() -> str:
        ran("step-save", ctx)
        return "ok"

    saved = await ctx.step.do("save", save)
    return {"value": value, "saved": saved, "customer": customer}


# --- agents -----------------------------------------------------------------------------------


@hearth.agent
def streamer(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/streamer")
    return "You stream."


@hearth.agent
def toolie(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/toolie")
    ctx.use_tool(charge)
    return "You charge."


@hearth.agent
def durable(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/durable")
    ctx.use_tool(provision)
    return "You provision."


@hearth.agent
def parallel(ctx: hearth.AgentContext) -> str:
    if os.environ.get("RENDER_FAILS") == "parallel":  # a release with a bug in its render
        raise RuntimeError("a bug in the render")
    ctx.use_model("scripted/parallel")
    ctx.use_tool(fast)
    ctx.use_tool(slow)
    return "You look things up."


@hearth.agent
def finisher(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/finisher")
    return "You answer once."


@hearth.agent(durability=hearth.Durability(max_attempts=3, timeout=600))
def fragile(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/fragile")
    ctx.use_tool(slow)
    return "You keep trying."


@hearth.agent(durability=hearth.Durability(max_attempts=10, timeout=1.5))
def hurried(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/hurried")
    ctx.use_tool(slow)
    return "You are in a hurry."


@hearth.agent
def stateful(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/stateful")
    count, set_count = ctx.use_state("count", 0)

    @hearth.tool
    async def bump(ctx: hearth.ToolContext) -> str:
        """Count something in persistent state."""
        ran("bump", ctx)
        set_count(count + 1)
        return "bumped"

    ctx.use_tool(bump)
    ctx.use_tool(slow)
    return f"count={count}"


@hearth.agent(durability=hearth.Durability(max_attempts=2, timeout=600))
def buggy(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/buggy")
    return "You trip over a bug."


# A bug planted in the runtime itself, for the harness to catch: building the model's request
# raises for the buggy agent. (Code of the app's own that raises, a provider's included, is
# reported as that code's failure and crashes nothing; only hearth's own code can do this.)
_build_request = model_turn.build_request


def _planted_bug(scope: Any, rendered: Any, model: str) -> ModelRequest:
    if scope.conversation_id.startswith("buggy/"):
        raise RuntimeError("a bug the runtime did not expect")
    return _build_request(scope, rendered, model)


model_turn.build_request = _planted_bug  # type: ignore[assignment]


def fragile_script(request: ModelRequest) -> Step:
    if last_user_text(request) == "hello again":
        return reply("hello, all is well")
    return calls(call("slow"))


def stateful_script(request: ModelRequest) -> Step:
    text = last_user_text(request)
    if isinstance(request.messages[-1], ToolResult):
        return reply(f"{results_summary(request)}; {request.system}")
    if text == "bump and wait":
        return calls(call("bump"), call("slow"))
    if text == "bump":
        return calls(call("bump"))
    return reply(request.system)


models = [
    ScriptedModel(
        "streamer",
        [
            stream("The answer ", "is ", "forty", "-two", delay=0.15),
            reply(" (continued after the cut)."),
        ],
    ),
    ScriptedModel("toolie", [calls(call("charge", amount=5)), results_summary]),
    ScriptedModel("durable", [calls(call("provision", customer="acme")), results_summary]),
    ScriptedModel("parallel", [calls(call("fast"), call("slow")), results_summary]),
    ScriptedModel("finisher", [reply("done once")]),
    ScriptedModel("fragile", fragile_script),
    ScriptedModel("hurried", [calls(call("slow")), stall()], repeat_last=True),
    ScriptedModel("stateful", stateful_script),
    ScriptedModel("buggy", [reply("never asked")]),
]

app = hearth.App(
    [streamer, toolie, durable, parallel, finisher, fragile, hurried, stateful, buggy],
    providers=models,
)
