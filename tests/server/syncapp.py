"""An agent whose tool is sync code that blocks for ``$HEARTH_TEST_BLOCK_S`` seconds (default
60): a worker thread that a graceful shutdown cannot interrupt (``syncapp:app``). Its channel
``slow`` (unsigned: any JSON body with an ``id``) takes 60 s to route a delivery: a request that
keeps the server waiting for its connections as it stops."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping

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


def _verify(headers: Mapping[str, str], body: bytes) -> hearth.Delivery:
    data = json.loads(body)
    return hearth.Delivery(id=data["id"], type="message", data=data, received_at=time.time())


async def _route(delivery: hearth.Delivery) -> hearth.Dispatch:
    await asyncio.sleep(60)
    return hearth.Dispatch("blocker", f"ch-{delivery.id}", message="from the channel")


app = hearth.App(
    [blocker],
    channels=[hearth.Channel("slow", verify=_verify, receive=_route)],
    providers=[ScriptedModel("blocker", [calls(call("block")), reply("done")], repeat_last=True)],
)
