"""An agent whose tool is sync code that blocks for ``$HEARTH_TEST_BLOCK_S`` seconds (default
60): a worker thread that a graceful shutdown cannot interrupt (``syncapp:app``)."""

from __future__ import annotations

import os
import time

import hearth
from hearth.testing import ScriptedModel, call, calls, reply

BLOCK_S = float(os.environ.get("HEARTH_TEST_BLOCK_S", "60"))


@hearth.tool
def block() -> str:
    """Block, as sync code waiting on something slow does."""
    time.sleep(BLOCK_S)
    return "unblocked"


@hearth.agent
def blocker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/blocker")
    ctx.use_tool(block)
    return "Block."


app = hearth.App(
    [blocker],
    providers=[ScriptedModel("blocker", [calls(call("block")), reply("done")], repeat_last=True)],
)
