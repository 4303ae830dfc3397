"""Agents for answers sent before their wait is recorded: the durable tool ``ask`` sends its
wait's id out (``step.wait_id``, as a mail with a link would) and then waits, beside the
ordinary call ``slow``, which holds the batch open until ``release`` is set; the wait is
recorded only once the batch pauses. ``boss`` delegates the same to a task.

Threading primitives, so that a test and a server in a thread of its own share them.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

import hearth
from hearth.testing import ScriptedModel, call, calls, reply


class EarlyWaits:
    def __init__(self, db: str = "memory") -> None:
        self.asked: queue.Queue[tuple[str, str]] = queue.Queue()  # (conversation, wait id)
        self.release = threading.Event()

        @hearth.tool(durable=True)
        async def ask(ctx: hearth.ToolContext) -> Any:
            """Ask a person."""
            self.asked.put((ctx.conversation_id, ctx.step.wait_id("approval")))
            return await ctx.step.wait("approval", prompt="ok?")

        @hearth.tool
        async def slow() -> str:
            """Take a while."""
            await asyncio.to_thread(self.release.wait, 60)
            return "slow done"

        @hearth.agent
        def early(ctx: hearth.AgentContext) -> str:
            ctx.use_model("scripted/early")
            ctx.use_tool(ask)
            ctx.use_tool(slow)
            return ""

        @hearth.agent
        def boss(ctx: hearth.AgentContext) -> str:
            ctx.use_model("scripted/boss")
            ctx.use_subagent(early, description="asks a person")
            return ""

        models = [
            ScriptedModel("early", [calls(call("ask"), call("slow")), reply("done")]),
            ScriptedModel(
                "boss", [calls(call("task", agent="early", prompt="go")), reply("boss done")]
            ),
        ]
        self.app = hearth.App([early, boss], db=db, providers=models, port=0)

    def first_asked(self, timeout: float = 10.0) -> tuple[str, str]:
        """The conversation and the wait id the first ``ask`` sent out."""
        return self.asked.get(timeout=timeout)
