"""An agent whose tool, when cancelled, cleans up for ``$HEARTH_TEST_CLEANUP_S`` seconds (default
30): work that winds down slower than a graceful shutdown allows (``cleanupapp:app``). One
attempt only (``max_attempts=1``): an attempt that a shutdown does not give back fails it. A
clean-up that ran to its end writes ``cleaned up`` to ``$HEARTH_TEST_LOG`` when it is set."""

from __future__ import annotations

import asyncio
import os

import hearth
from hearth.providers.base import ModelRequest, ToolResult
from hearth.testing import ScriptedModel, Step, call, calls, reply

CLEANUP_S = float(os.environ.get("HEARTH_TEST_CLEANUP_S", "30"))


def _note(what: str) -> None:
    if os.environ.get("HEARTH_TEST_LOG"):
        with open(os.environ["HEARTH_TEST_LOG"], "a") as log:
            log.write(what + "\n")


@hearth.tool
async def charge() -> str:
    """Charge an order; on cancellation, undo the hold at the bank (slowly)."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await asyncio.sleep(CLEANUP_S)
        _note("cleaned up")
        raise
    return "charged"


def _script(request: ModelRequest) -> Step:
    done = isinstance(request.messages[-1], ToolResult)
    return reply("done") if done else calls(call("charge"))


@hearth.agent(durability=hearth.Durability(max_attempts=1))
def shop(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/shop")
    ctx.use_tool(charge)
    return "Charge it."


app = hearth.App([shop], providers=[ScriptedModel("shop", _script)])
