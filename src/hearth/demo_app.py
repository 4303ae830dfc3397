"""The app behind ``hearth demo``; serve it yourself with ``hearth serve hearth.demo_app:app``.

One agent, ``shop``, on the scripted model (no API key needed). Asked for anything, the model
calls two tools at once:

- ``place_order`` — durable, two steps: an expensive price calculation, a pause, then saving the
  order. A crash in the pause must not run the calculation again.
- ``check_stock`` — ordinary and slow. A crash while it runs leaves its outcome unknown, so
  recovery does not re-run it: the model is told it was interrupted.

Each run of a step's function is counted in ``$HEARTH_DEMO_DIR/runs-<step>.txt`` (default: the
system's temporary folder), so the demo can show that a recorded step never runs twice.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, ToolResult
from hearth.testing import ScriptedModel, Step, call, calls, reply

PRICE_S = 0.4  # the "expensive calculation"
PAUSE_S = 2.5  # between the two steps: the window in which the demo kills the server
STOCK_S = 4.0  # the ordinary tool: still running when the server dies


def runs_file(step: str) -> Path:
    folder = Path(os.environ.get("HEARTH_DEMO_DIR") or tempfile.gettempdir())
    return folder / f"runs-{step}.txt"


def count_run(step: str) -> None:
    with runs_file(step).open("a") as f:
        f.write("run\n")


def runs(step: str) -> int:
    path = runs_file(step)
    return len(path.read_text().splitlines()) if path.exists() else 0


@hearth.tool(durable=True)
async def place_order(item: str, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Price the item, then save the order."""

    async def expensive_calculation() -> float:
        count_run("expensive_calculation")
        await asyncio.sleep(PRICE_S)
        return 42.0

    async def save() -> str:
        count_run("save")
        return f"order-{item}-1"

    price = await ctx.step.do("expensive_calculation", expensive_calculation)
    await asyncio.sleep(PAUSE_S)
    order = await ctx.step.do("save", save)
    return {"order": order, "price": price}


@hearth.tool
async def check_stock(item: str) -> dict[str, Any]:
    """Ask the slow warehouse system whether the item is in stock."""
    await asyncio.sleep(STOCK_S)
    return {"item": item, "in_stock": True}


def _answer(request: ModelRequest) -> Step:
    results = {m.name: m for m in request.messages if isinstance(m, ToolResult)}
    order, stock = results.get("place_order"), results.get("check_stock")
    text = "Your order is saved"
    if order is not None and not order.is_error and isinstance(order.content, dict):
        text += f" as {order.content.get('order')} at {order.content.get('price')}"
    if stock is not None and stock.is_error:
        text += "; the stock check was cut off, so I cannot confirm the stock yet."
    else:
        text += "; the item is in stock."
    return reply(text)


model = ScriptedModel(
    "demo",
    [
        calls(
            call("place_order", item="teapot"),
            call("check_stock", item="teapot"),
            text="Placing the order and checking the stock.",
        ),
        _answer,
    ],
    repeat_last=True,
)


@hearth.agent
def shop(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/demo")
    ctx.use_tool(place_order)
    ctx.use_tool(check_stock)
    return "You take orders for a small shop."


app = hearth.App([shop], providers=[model])
