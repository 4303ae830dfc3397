"""An agent whose context and state grow each turn, for the fork tests (``forkapp:app``).

``remember X`` makes the model call ``remember`` (which adds X to the persistent ``notes``),
then answer; anything else is echoed. The system prompt lists the notes, so a request shows
the state it was rendered with.
"""

from __future__ import annotations

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply


def _script(request: ModelRequest) -> Step:
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResult):
        return reply(f"noted {last.content}")
    said = last.content if isinstance(last, UserTurn) else ""
    word, _, rest = str(said).partition(" ")
    if word == "remember":
        return calls(call("remember", note=rest))
    return reply(f"echo: {said}")


MODEL = ScriptedModel("notary", _script)


@hearth.agent
def notary(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/notary")
    notes, set_notes = ctx.use_state("notes", [])

    @hearth.tool
    def remember(note: str) -> str:
        """Keep a note."""
        set_notes([*notes, note])
        return note

    ctx.use_tool(remember)
    return f"You keep notes. Notes so far: {', '.join(notes) or 'none'}."


app = hearth.App([notary], providers=[MODEL])
