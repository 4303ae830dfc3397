"""A long tool loop under a small context window (``compactapp:app``), for the compaction tests.

The agent walks a route of ``TURNS`` steps, one ``walk`` call per turn. Its scripted model reads
where it is from the request alone (the last step in a tool result or in the summary), so it keeps
walking across compactions and restarts. The model also plays the provider's part strictly: a
request estimated past its window, or a turn that lost the user's message, is refused with a
terminal error, so the submission fails instead of passing by accident. Summaries say how far the
walk got.

``$HEARTH_LOOP_TURNS`` (default 200) and ``$HEARTH_LOOP_WINDOW`` (default 1000 tokens) set the
route and the window.
"""

from __future__ import annotations

import os
import re
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn, estimate_tokens
from hearth.runtime.compaction import SUMMARY_PROMPT
from hearth.testing import ScriptedModel, Step, call, calls, error, reply
from hearth.testing.toollog import ran

TURNS = int(os.environ.get("HEARTH_LOOP_TURNS", "200"))
WINDOW = int(os.environ.get("HEARTH_LOOP_WINDOW", "1000"))
TASK = "Walk the whole route, one step per call, then say where you arrived."

_SUMMARY_STEP = re.compile(r"walked (\d+) steps")
_RESULT_STEP = re.compile(r'\{"step": (\d+)')


@hearth.tool
async def walk(n: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Walk step ``n`` of the route."""
    ran("walk", ctx)
    return {"step": n, "seen": f"step {n}: " + "gravel and pines " * 8}


def steps_walked(request: ModelRequest) -> int:
    """The last step the request shows: in a ``walk`` result, else in the summary."""
    walked = 0
    if request.summary:
        found = _SUMMARY_STEP.search(request.summary)
        walked = int(found.group(1)) if found else 0
    for m in request.messages:
        if isinstance(m, ToolResult) and isinstance(m.content, dict):
            walked = max(walked, int(m.content.get("step", 0)))
        elif isinstance(m, ToolResult) and isinstance(m.content, str):  # clipped for a summary
            found = _RESULT_STEP.match(m.content)
            walked = max(walked, int(found.group(1)) if found else 0)
    return walked


def user_texts(request: ModelRequest) -> list[str]:
    return [m.content for m in request.messages if isinstance(m, UserTurn)]


def walker(turns: int, window: int, task: str = TASK) -> Any:
    """The script of a walk of ``turns`` steps under a ``window``-token model."""

    def script(request: ModelRequest) -> Step:
        size = estimate_tokens(request)
        if size > window:
            return error("terminal", f"received {size} tokens; the window is {window}")
        if request.system == SUMMARY_PROMPT:
            return reply(f"The user asked for a walk; we walked {steps_walked(request)} steps.")
        if task not in user_texts(request):
            return error("terminal", "the user's message is missing from the request")
        walked = steps_walked(request)
        if walked >= turns:
            return reply(f"Arrived after {walked} steps.")
        return calls(call("walk", n=walked + 1, id=f"walk-{walked + 1}"))

    return script


def render_walker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/walker")
    ctx.use_tool(walk)
    return "You walk routes."


walker_agent = hearth.Agent(render_walker, name="walker")
model = ScriptedModel("walker", walker(TURNS, WINDOW), context_window=WINDOW)
app = hearth.App([walker_agent], providers=[model])
