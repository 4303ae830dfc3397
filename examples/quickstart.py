"""The README's quick example: an agent with an ordinary and a durable tool, on SQLite."""

import asyncio
import uuid

import hearth
from hearth.testing import ScriptedModel, call, calls, reply

sent: list[str] = []


@hearth.tool
async def lookup_order(order_id: str) -> dict[str, str]:
    """Look an order up."""  # the docstring is what the model reads
    return {"id": order_id, "status": "shipped", "email": "ada@example.com"}


@hearth.tool(durable=True)
async def send_receipt(order_id: str, ctx: hearth.ToolContext) -> dict[str, bool]:
    """Email the receipt of an order."""
    email = await ctx.step.do("load", lambda: f"customer-{order_id}@example.com")
    await ctx.step.do("send", lambda: sent.append(f"receipt:{order_id}:{email}"))
    return {"sent": True}


@hearth.agent(durability=hearth.Durability(max_attempts=5, timeout=600))
def support(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/support")  # or "openai/gpt-4o-mini", "anthropic/claude-…"
    ctx.use_tool(lookup_order)
    ctx.use_tool(send_receipt)
    return "You are a customer support agent."


model = ScriptedModel(
    "support",
    [
        calls(call("lookup_order", order_id="7"), call("send_receipt", order_id="7")),
        reply("Order 7 has shipped and its receipt is on its way."),
    ],
)
app = hearth.App([support], db="sqlite:///support.db", providers=[model])


async def main() -> None:
    async with app.run() as rt:
        # A new conversation each run (the scripted model knows one exchange).
        receipt = await rt.dispatch("support", f"c-{uuid.uuid4().hex[:8]}", "Where is order 7?")
        print(await rt.read(receipt))  # Reply(text=..., submission_id=..., outcome='completed')


asyncio.run(main())
