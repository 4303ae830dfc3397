"""A refund tool that asks a person before it pays out more than 100, and survives a restart
while it waits.

``step.wait`` pauses the submission durably: no task, no lease, no process needs to stay up.
Here the runtime is even stopped while the approval is pending; a new runtime on the same file
resolves it (as ``POST /agents/support/c-2/waits/{wait_id}``, ``conv.resolve`` or
``hearth resolve`` would), and the refund tool runs again with its first step replayed from the
records — the order is not loaded twice — and ``step.wait`` returning the approval.

Run it: ``.venv/bin/python examples/refund_approval.py``
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply

APPROVAL_ABOVE = 100
loads: Counter[str] = Counter()  # order loads per conversation, to show a step runs once


@hearth.tool(durable=True)
async def refund(order_id: str, amount: int, ctx: hearth.ToolContext) -> dict[str, Any]:
    """Refund part of an order. Refunds above 100 need a person's approval."""

    def load_order() -> dict[str, Any]:
        loads[ctx.conversation_id] += 1
        return {"id": order_id, "customer": "ada@example.com"}

    order = await ctx.step.do("load", load_order)
    if amount > APPROVAL_ABOVE:
        try:
            decision = await ctx.step.wait(
                "approval",
                prompt=f"Refund {amount} EUR on order {order_id} to {order['customer']}?",
                timeout=24 * 3600,
            )
        except hearth.WaitTimedOut:
            return {"refunded": 0, "reason": "nobody approved it within a day"}
        if not decision.get("approved"):
            return {"refunded": 0, "reason": f"refused by {decision.get('by')}"}
    paid: dict[str, Any] = await ctx.step.do("pay", lambda: {"refunded": amount, "order": order_id})
    return paid


def support_model(request: ModelRequest) -> Step:
    last = request.messages[-1]
    if isinstance(last, ToolResult):
        return reply(f"Done: {last.content}")
    asked = next(str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn))
    amount = int(asked.split()[-1])
    return calls(call("refund", order_id="A-7", amount=amount))


@hearth.agent
def support(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/support")
    ctx.use_tool(refund)
    return "You refund orders."


def make_app(db: Path) -> hearth.App:
    return hearth.App([support], db=str(db), providers=[ScriptedModel("support", support_model)])


async def main() -> None:
    db = Path(tempfile.mkdtemp(prefix="hearth-refund-")) / "support.db"
    async with make_app(db).run() as rt:
        small = await rt.dispatch("support", "c-1", "please refund 40")
        print("small refund:", (await rt.read(small)).text)
        large = await rt.dispatch("support", "c-2", "please refund 250")
        for _ in range(1000):  # the model calls the tool, which stops at its wait
            if await rt.waits():
                break
            await asyncio.sleep(0.01)
        [wait] = await rt.waits()
        print(f"waiting for {wait.wait_id}: {wait.prompt}")
        print("status:", (await rt.submission(large.submission_id)).status)
    print("runtime stopped while the approval is pending")

    async with make_app(db).run() as rt:
        print("pending after the restart:", [w.name for w in await rt.waits()])
        await rt.resolve("support", "c-2", wait.wait_id, {"approved": True, "by": "maria"})
        print("large refund:", (await rt.read(large)).text)
        sub = await rt.submission(large.submission_id)
        print(f"attempts: {sub.attempt}, of which ended by a wait: {sub.waits}")
    print("order loads per conversation:", dict(loads))


if __name__ == "__main__":
    asyncio.run(main())
