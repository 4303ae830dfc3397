"""A lead agent that delegates research to a subagent through the built-in ``task`` tool.

Run it: ``.venv/bin/python examples/subagents.py``. The child runs as its own conversation
(``researcher/<derived id>``) with its own stream; its final text is the lead's tool result.
"""

from __future__ import annotations

import asyncio

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.records import ChildConversationLinked
from hearth.testing import ScriptedModel, Step, call, calls, reply


@hearth.agent
def researcher(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/researcher")
    return "You research one question and answer it briefly."


@hearth.agent
def lead(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/lead")
    ctx.use_subagent(researcher, description="Research a question in depth")
    return "You coordinate research."


def lead_model(request: ModelRequest) -> Step:
    last = request.messages[-1]
    if isinstance(last, ToolResult):
        return reply(f"My researcher reports: {last.content}")
    return calls(call("task", agent="researcher", prompt="What is the capital of Norway?"))


def researcher_model(request: ModelRequest) -> Step:
    question = next(m.content for m in request.messages if isinstance(m, UserTurn))
    return reply(f"{question} It is Oslo.")


app = hearth.App(
    [lead, researcher],
    db="memory",
    providers=[ScriptedModel("lead", lead_model), ScriptedModel("researcher", researcher_model)],
)


async def main() -> None:
    async with app.run() as rt:
        print((await rt.read(await rt.dispatch("lead", "q-1", "Research Norway"))).text)
        for record in await rt.history("lead", "q-1"):
            if isinstance(record, ChildConversationLinked):
                agent, _, id = record.child_conversation_id.partition("/")
                for child_record in await rt.history(agent, id):
                    print(f"  child {child_record.offset}: {child_record.type}")


if __name__ == "__main__":
    asyncio.run(main())
