"""An agent for the tests of state writes across crashes (``writesapp:app``): its one message is
a JSON list of calls ``[[tool, id, {args}], ...]``, asked for in one batch; then it replies.

``ord`` (ordinary) and ``dur`` (durable: its work is a step) each wait ``pre`` seconds, set state
``key`` (``a`` or ``b``) to ``value``, then wait ``post`` seconds. ``inside`` (durable) sets it
inside a step's function, then waits ``post`` seconds in another step; ``pair`` sets it in two
steps run at once, the one asked for first setting it last; ``crossed`` too, the one that sets
it first recorded last.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.testing import ScriptedModel, Step, call, calls, reply


def script(request: ModelRequest) -> Step:
    if isinstance(request.messages[-1], ToolResult):
        return reply("done")
    text = next(str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn))
    return calls(*[call(name, id=cid, **args) for name, cid, args in json.loads(text)])


@hearth.agent
def w(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/w")
    setters = {key: ctx.use_state(key, None)[1] for key in ("a", "b")}

    def set_state(key: str, value: Any) -> None:
        setters[key](value)

    @hearth.tool(name="ord")
    async def ordinary(key: str, value: Any, pre: float = 0, post: float = 0) -> str:
        """Set a piece of state (an ordinary tool)."""
        await asyncio.sleep(pre)
        set_state(key, value)
        await asyncio.sleep(post)
        return f"set {key}"

    @hearth.tool(durable=True)
    async def dur(
        key: str, value: Any, ctx: hearth.ToolContext, pre: float = 0, post: float = 0
    ) -> str:
        """Set a piece of state, then work a while in a step (a durable tool)."""
        await asyncio.sleep(pre)
        set_state(key, value)
        await ctx.step.do("work", lambda: asyncio.sleep(post))
        return f"set {key}"

    @hearth.tool(durable=True)
    async def inside(key: str, value: Any, ctx: hearth.ToolContext, post: float = 0) -> str:
        """Set a piece of state inside a step's function, then work a while in another step."""
        await ctx.step.do("set", lambda: set_state(key, value))
        await ctx.step.do("work", lambda: asyncio.sleep(post))
        return f"set {key}"

    @hearth.tool(durable=True)
    async def pair(key: str, ctx: hearth.ToolContext, post: float = 0) -> str:
        """Two steps at once set ``key``: the one asked for first sets it last."""

        async def late() -> None:
            await asyncio.sleep(0.2)
            set_state(key, "late")

        async def early() -> None:
            set_state(key, "early")

        await asyncio.gather(ctx.step.do("late", late), ctx.step.do("early", early))
        await ctx.step.do("work", lambda: asyncio.sleep(post))
        return f"set {key}"

    @hearth.tool(durable=True)
    async def crossed(key: str, ctx: hearth.ToolContext, post: float = 0) -> str:
        """Two steps at once set ``key``: the one that sets it first is recorded last."""

        async def first() -> None:
            set_state(key, "first")
            await asyncio.sleep(0.4)

        async def second() -> None:
            await asyncio.sleep(0.2)
            set_state(key, "second")

        await asyncio.gather(ctx.step.do("first", first), ctx.step.do("second", second))
        await ctx.step.do("work", lambda: asyncio.sleep(post))
        return f"set {key}"

    ctx.use_tool(ordinary)
    ctx.use_tool(dur)
    ctx.use_tool(inside)
    ctx.use_tool(pair)
    ctx.use_tool(crossed)
    return "Set what you are asked to."


app = hearth.App([w], providers=[ScriptedModel("w", script)])
