"""An app whose channel ``hook`` (unsigned: any JSON body with an ``id``) takes
``$HEARTH_TEST_ROUTE_S`` seconds (default 30) to route a delivery, as a routing lookup that
waits on something slow does: a request still running when a shutdown's grace ends
(``slowrouteapp:app``)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping

import hearth
from hearth.testing import ScriptedModel, reply

ROUTE_S = float(os.environ.get("HEARTH_TEST_ROUTE_S", "30"))


@hearth.agent
def quick(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/quick")
    return "Answer."


def _verify(headers: Mapping[str, str], body: bytes) -> hearth.Delivery:
    data = json.loads(body)
    return hearth.Delivery(id=data["id"], type="message", data=data, received_at=time.time())


async def _route(delivery: hearth.Delivery) -> hearth.Dispatch:
    await asyncio.sleep(ROUTE_S)
    return hearth.Dispatch("quick", f"ch-{delivery.id}", message="from the channel")


app = hearth.App(
    [quick],
    channels=[hearth.Channel("hook", verify=_verify, receive=_route)],
    providers=[ScriptedModel("quick", [reply("ok")], repeat_last=True)],
)
