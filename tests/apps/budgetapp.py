"""An agent that never stops calling a tool, under a spending budget (``budgetapp:app``).

The scripted model reports usage for every turn (its estimate of the request, plus the output),
so the tokens a submission spent can be summed from its records. ``$HEARTH_TEST_MAX_TOKENS`` is
the budget (default 2000).
"""

from __future__ import annotations

import os

import hearth
from hearth.providers.base import ModelRequest, ToolResult
from hearth.testing import ScriptedModel, Step, call, calls, reply
from hearth.testing.toollog import ran

MAX_TOKENS = int(os.environ.get("HEARTH_TEST_MAX_TOKENS", "2000"))


@hearth.tool
async def search(page: int, ctx: hearth.ToolContext) -> str:
    """Search one more page."""
    ran("search", ctx)
    return f"page {page}: nothing conclusive yet, " + "lorem ipsum " * 20


def loop(request: ModelRequest) -> Step:
    pages = sum(isinstance(m, ToolResult) for m in request.messages)
    return calls(call("search", page=pages + 1), text=f"looking at page {pages + 1}")


def delegating(request: ModelRequest) -> Step:
    if isinstance(request.messages[-1], ToolResult):
        return reply("the researcher gave up")
    return calls(call("task", agent="researcher", prompt="search forever"))


@hearth.agent(durability=hearth.Durability(max_tokens=MAX_TOKENS))
def researcher(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/loop")
    ctx.use_tool(search)
    return "Search until you are sure."


@hearth.agent(durability=hearth.Durability(max_tokens=MAX_TOKENS))
def lead(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/delegating")
    ctx.use_subagent(researcher, description="Searches")
    return "Delegate the search."


AGENTS = [researcher, lead]
MODELS = [ScriptedModel("loop", loop), ScriptedModel("delegating", delegating)]
app = hearth.App(AGENTS, providers=MODELS)
