"""Version 2 of ``deploy_v1`` (``deploy_v2:app``): what a deploy changed.

``ship`` and ``ask`` are gone, ``bill`` is no longer durable, ``lookup`` is gone, ``shop`` no
longer delegates to ``packer``, and the agent ``legacy`` is gone. ``keep`` stays durable.
"""

from __future__ import annotations

from deploy_v1 import MODELS, keep

import hearth


@hearth.tool
async def bill() -> str:
    """Bill the customer (now an ordinary tool)."""
    return "billed"


@hearth.agent
def shop(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/shop")
    ctx.use_tool(bill)
    ctx.use_tool(keep)
    return "Run the shop."


app = hearth.App([shop], providers=MODELS)
