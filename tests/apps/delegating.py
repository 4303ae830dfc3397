"""A lead agent delegating to researchers (and a researcher to a fact checker), for crash tests
of subagent recovery. $DELEGATE=off makes the lead stop declaring its subagent (a redeploy);
$LEAD_SEARCH=on makes it also search, itself, beside its tasks (an ordinary call in the batch)."""

from __future__ import annotations

import asyncio
import os

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply
from hearth.testing.toollog import ran


def prompt_of(request: ModelRequest) -> str:
    return next((str(m.content) for m in request.messages if isinstance(m, UserTurn)), "")


def results(request: ModelRequest) -> list[ToolResult]:
    return [m for m in request.messages if isinstance(m, ToolResult)]


@hearth.tool
async def search(query: str, ctx: hearth.ToolContext) -> str:
    """Search the web."""
    ran(f"search:{query}", ctx)
    await asyncio.sleep(0.3)
    return f"results for {query}"


@hearth.agent
def checker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/checker")
    ctx.use_tool(search)
    return "You check facts."


@hearth.agent
def researcher(ctx: hearth.AgentContext) -> str:
    if os.environ.get("RENDER_FAILS") == "researcher":  # a release with a bug in its render
        raise RuntimeError("a bug in the render")
    ctx.use_model("scripted/researcher")
    ctx.use_tool(search)
    ctx.use_subagent(checker, description="Check a fact")
    return "You research."


@hearth.agent(durability=hearth.Durability(max_attempts=int(os.environ.get("LEAD_ATTEMPTS", "10"))))
def lead(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/lead")
    if os.environ.get("LEAD_SEARCH") == "on":
        ctx.use_tool(search)
    if os.environ.get("DELEGATE", "on") == "on":
        ctx.use_subagent(researcher, description="Research a question")
    return "You lead."


def lead_script(request: ModelRequest) -> Step:
    done = results(request)
    if done:
        return reply(" | ".join(f"{r.content}" for r in done))
    topics = prompt_of(request).split(",")
    tasks = [call("task", agent="researcher", prompt=t.strip()) for t in topics]
    if os.environ.get("LEAD_SEARCH") == "on":
        tasks.append(call("search", query="lead notes"))
    return calls(*tasks)


def researcher_script(request: ModelRequest) -> Step:
    done = results(request)
    topic = prompt_of(request)
    if not done:
        if topic.startswith("deep"):
            return calls(call("task", agent="checker", prompt=f"check {topic}"))
        return calls(call("search", query=topic))
    outcome = done[-1]
    kind = outcome.content.get("type") if outcome.is_error else "ok"
    return reply(f"{topic}: {kind}")


def checker_script(request: ModelRequest) -> Step:
    done = results(request)
    if not done:
        return calls(call("search", query=prompt_of(request)))
    outcome = done[-1]
    return reply(f"checked ({outcome.content.get('type') if outcome.is_error else 'ok'})")


app = hearth.App(
    [lead, researcher, checker],
    providers=[
        ScriptedModel("lead", lead_script),
        ScriptedModel("researcher", researcher_script),
        ScriptedModel("checker", checker_script),
    ],
)
