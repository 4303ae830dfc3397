"""Compaction inside a long tool loop, through the real OpenAI-compatible and Anthropic clients
talking to the fake model server over loopback HTTP.

The fake server answers from each request's body: it reads how far the walk got (the last tool
result, or the summary in the system prompt) and asks for the next step. The tests read the bodies
the server received: no tool result ever arrives without its call, and the user's messages (the
input and one that joined the loop) are in every turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakellm import FakeServer, Seen
from test_end_to_end import AnthropicDialect, Dialect, OpenAIDialect

import hearth
import hearth.runtime.recovery
from hearth.providers.base import ModelProvider
from hearth.records import Compaction, Record, ToolOutcome, UserMessage
from hearth.runtime.compaction import SUMMARY_PROMPT

pytestmark = pytest.mark.anyio

TURNS = 30
WINDOW = 1000
TASK = "Walk the whole route, one step per call, then say where you arrived."
EXTRA = "Also count the bridges you cross."
_WALKED = re.compile(r"walked (\d+) steps")


@pytest.fixture(params=[OpenAIDialect(), AnthropicDialect()], ids=lambda d: d.name)
def dialect(request: pytest.FixtureRequest) -> Dialect:
    d: Dialect = request.param
    return d


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hearth.runtime.recovery, "BACKOFF_BASE_S", 0.01)


class Walk:
    """The agent under test: one ``step`` call per turn; step 4 lets a message join."""

    def __init__(self) -> None:
        self.rt: Any = None
        self.joined: Any = None

    def agent(self, model: str) -> hearth.Agent:
        @hearth.tool
        async def step(n: int) -> dict[str, Any]:
            """Walk step ``n`` of the route."""
            if n == 4 and self.joined is None:
                self.joined = await self.rt.dispatch("walker", "c1", EXTRA)
            return {"step": n, "seen": f"step {n}: " + "gravel and pines " * 8}

        def render(ctx: hearth.AgentContext) -> str:
            ctx.use_model(model)
            ctx.use_tool(step)
            return "You walk routes."

        return hearth.Agent(render, name="walker")


def walked(dialect: Dialect, body: dict[str, Any]) -> int:
    found = _WALKED.search(dialect.system(body))
    steps = [int(found.group(1))] if found else [0]
    for content in dialect.tool_results(body).values():
        steps.append(int(json.loads(content)["step"]))
    return max(steps)


def responder(dialect: Dialect) -> Any:
    def answer(seen: Seen) -> list[str]:
        body = seen.json()
        n = walked(dialect, body)
        if dialect.system(body).startswith(SUMMARY_PROMPT):
            return dialect.reply(f"The user asked for a walk; we walked {n} steps.")
        if n >= TURNS:
            return dialect.reply(f"Arrived after {n} steps.")
        return dialect.tool_calls([(f"walk-{n + 1}", "step", [json.dumps({"n": n + 1})])])

    return answer


@pytest.fixture
async def walker(
    server: FakeServer, dialect: Dialect, tmp_path: Path
) -> AsyncIterator[tuple[Any, Walk]]:
    model = dialect.model.partition("/")[2]
    provider: ModelProvider = dialect.provider(server.url, context_windows={model: WINDOW})
    walk = Walk()
    app = hearth.App(
        [walk.agent(dialect.model)], db=f"sqlite:///{tmp_path / 'h.db'}", providers=[provider]
    )
    async with app.run() as rt:
        walk.rt = rt
        yield rt, walk
    await provider.aclose()


def of(records: list[Record], kind: type[Record]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


async def test_a_long_loop_compacts_and_keeps_calls_with_their_results(
    server: FakeServer, dialect: Dialect, walker: tuple[Any, Walk]
) -> None:
    rt, walk = walker
    server.respond(responder(dialect))
    reply = await rt.read(await rt.dispatch("walker", "c1", TASK), timeout=60)
    assert reply.text == f"Arrived after {TURNS} steps."
    records = await rt.history("walker", "c1")
    compactions = of(records, Compaction)
    assert len(compactions) >= 2
    task, late = of(records, UserMessage)
    assert late.content == EXTRA
    assert (await rt.submission(walk.joined.submission_id)).status == "joined"
    for c in compactions:
        assert c.kept_offsets is not None and task.offset in c.kept_offsets
    assert [o.content["step"] for o in of(records, ToolOutcome)] == list(range(1, TURNS + 1))
    bodies = [seen.json() for seen in server.requests]
    turns = [b for b in bodies if not dialect.system(b).startswith(SUMMARY_PROMPT)]
    assert len(bodies) - len(turns) == len(compactions)
    for body in bodies:
        # Every tool result is sent as the answer to a call the same request shows.
        assert set(dialect.tool_results(body)) <= set(dialect.call_ids(body))
        assert "[result of tool call" not in json.dumps(body)
    for body in turns:
        said = [text for role, text in dialect.turns(body) if role == "user"]
        assert any(TASK in text for text in said)
        if walked(dialect, body) > 4:
            assert any(EXTRA in text for text in said)
        assert "tools" in body


async def test_a_message_alone_larger_than_the_window_is_never_sent(
    server: FakeServer, walker: tuple[Any, Walk]
) -> None:
    rt, _ = walker
    with pytest.raises(hearth.SubmissionFailed) as failed:
        await rt.read(await rt.dispatch("walker", "c1", "x" * 5000), timeout=20)
    assert failed.value.type == "context_overflow"
    assert f"{WINDOW}-token window" in failed.value.error["message"]
    assert server.requests == []
