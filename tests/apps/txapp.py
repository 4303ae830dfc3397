"""Agents for the ``step.transaction`` torture tests (``txapp:app``, on PostgreSQL): a durable
tool books twice, each time inserting a row keyed by its tool call id and step into the
application's table ``$TX_TABLE`` (in the database's own schema, with no unique key, so a
duplicate would show) inside ``step.transaction``, with a ``step.do`` between the two."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, ScriptStep, call, calls, reply
from hearth.testing.toollog import ran

TABLE = os.environ.get("TX_TABLE", "bookings")


async def insert(conn: Any, call_id: str, step: str, n: int) -> int:
    """Book one row; the value is how many rows the call has now (1, then 2). ``call_id`` is
    the conversation and the tool call id (a scripted model's call ids repeat across
    conversations)."""
    await conn.execute(
        f"INSERT INTO {TABLE} (tool_call_id, step, n) VALUES (%s, %s, %s)", (call_id, step, n)
    )
    cursor = await conn.execute(f"SELECT count(*) FROM {TABLE} WHERE tool_call_id = %s", (call_id,))
    row = await cursor.fetchone()
    return int(row[0])


@hearth.tool(durable=True)
async def book(n: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Book a seat, twice over."""
    ran("book-start", ctx)
    call_id = f"{ctx.conversation_id}:{ctx.tool_call_id}"
    first = await ctx.step.transaction("first", lambda conn: insert(conn, call_id, "first", n))
    mid = await ctx.step.do("mid", lambda: n * 2)
    second = await ctx.step.transaction("second", lambda conn: insert(conn, call_id, "second", n))
    return {"first": first, "mid": mid, "second": second}


@hearth.tool(durable=True)
async def slow_book(ctx: hearth.ToolContext) -> int:
    """Book a seat, lingering inside the transaction for ``$TX_SLEEP`` seconds."""
    call_id = f"{ctx.conversation_id}:{ctx.tool_call_id}"

    async def linger(conn: Any) -> int:
        booked = await insert(conn, call_id, "first", 1)
        ran("slow-in-transaction", ctx)
        await asyncio.sleep(float(os.environ.get("TX_SLEEP", "0")))
        return booked

    return int(await ctx.step.transaction("first", linger))


def script(request: ModelRequest) -> ScriptStep:
    if request.messages and isinstance(request.messages[-1], ToolResult):
        return reply("booked")
    text = next((str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn)), "")
    if text.startswith("slow"):
        return calls(call("slow_book"))
    if text.startswith("book"):
        return calls(call("book", n=1), call("book", n=2))
    return reply(f"echo: {text}")


@hearth.agent(durability=hearth.Durability(max_attempts=50, timeout=3600))
def booker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/booker")
    ctx.use_tool(book)
    ctx.use_tool(slow_book)
    return "You book."


app = hearth.App([booker], providers=[ScriptedModel("booker", script)])
