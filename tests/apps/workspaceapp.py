"""Agents for the workspace crash tests: each writes a file in one tool batch and reads it back in
the next. ``keeper`` has a durable workspace, ``scratch`` an ephemeral one; both live next to the
harness's tool log ($HEARTH_TEST_LOG), under ``workspaces/``."""

from __future__ import annotations

import os
from pathlib import Path

import hearth
from hearth.providers.base import ModelRequest, ToolResult
from hearth.testing import ScriptedModel, Step, call, calls, reply

ROOT = Path(os.environ["HEARTH_TEST_LOG"]).parent / "workspaces"
DURABLE = hearth.LocalWorkspace(ROOT / "durable")
EPHEMERAL = hearth.EphemeralWorkspace(ROOT / "ephemeral")


def what_the_read_showed(request: ModelRequest) -> Step:
    last = request.messages[-1]
    assert isinstance(last, ToolResult)
    if last.is_error:
        return reply(f"read failed: {last.content['message']}")
    return reply(f"read: {last.content}")


SCRIPT: list[Step] = [
    calls(call("write_file", id="write", path="notes.txt", content="from the first attempt")),
    calls(call("read_file", id="read", path="notes.txt")),
    what_the_read_showed,
]


@hearth.agent
def keeper(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/keeper")
    ctx.use_workspace(DURABLE)
    return "You keep notes."


@hearth.agent
def scratch(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/scratch")
    ctx.use_workspace(EPHEMERAL)
    return "You keep notes on scratch paper."


app = hearth.App(
    [keeper, scratch],
    providers=[ScriptedModel("keeper", SCRIPT), ScriptedModel("scratch", SCRIPT)],
)
