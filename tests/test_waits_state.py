"""State writes of a batch that pauses for waits commit with the batch once it resumes (SPEC §2,
§15), also when the pause makes no wait record of the batch's own to carry them: a batch whose
waiting call is a task whose child waits, at any depth."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.runtime.runtime import Runtime
from hearth.testing import ScriptedModel, Step, call, calls, reply
from hearth.testing.invariants import assert_invariants

pytestmark = pytest.mark.anyio

RAN: list[str] = []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def script(request: ModelRequest) -> Step:
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResult):
        return reply("done")
    text = next((str(m.content) for m in reversed(request.messages) if isinstance(m, UserTurn)), "")
    if text == "two waits":
        return calls(call("ask", name="a"), call("ask", name="b"), call("note"))
    if text == "delegate":
        return calls(call("note"), call("task", agent="clerk", prompt="one wait"))
    if text == "delegate deeper":
        return calls(call("note"), call("task", agent="mid", prompt="delegate"))
    if text == "one wait":
        return calls(call("ask", name="c"))
    return reply("echo")


@hearth.agent(durability=hearth.Durability(max_attempts=1, timeout=3600))
def clerk(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/clerk")
    answers = {name: ctx.use_state(name, None)[1] for name in ("a", "b", "c")}
    notes, set_notes = ctx.use_state("notes", 0)

    @hearth.tool(durable=True)
    async def ask(name: str, ctx: hearth.ToolContext) -> str:
        """Ask a person; remember the answer in state, under the question's name."""
        answer = await ctx.step.wait(name, prompt=f"{name}?")
        RAN.append(name)
        answers[name](answer)
        return str(answer)

    @hearth.tool
    async def note(ctx: hearth.ToolContext) -> str:
        """Count a note in state."""
        RAN.append("note")
        set_notes(notes + 1)
        return "noted"

    ctx.use_tool(ask)
    ctx.use_tool(note)
    return "Ask."


def delegating(name: str, to: hearth.Agent) -> hearth.Agent:
    """An agent that notes in state and delegates, as ``name``."""

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/clerk")
        notes, set_notes = ctx.use_state("notes", 0)

        @hearth.tool
        async def note(ctx: hearth.ToolContext) -> str:
            """Count a note in state."""
            RAN.append(f"{name}-note")
            set_notes(notes + 1)
            return "noted"

        ctx.use_tool(note)
        ctx.use_subagent(to, description="Asks people")
        return "Delegate."

    return hearth.agent(name=name)(render)


mid = delegating("mid", clerk)
front = delegating("front", clerk)
top = delegating("top", mid)


def app(db: str) -> hearth.App:
    return hearth.App([clerk, front, top], db=db, providers=[ScriptedModel("clerk", script)])


async def pending(rt: Runtime, n: int, timeout: float = 10.0) -> list[Any]:
    end = time.monotonic() + timeout
    while len(waits := await rt.waits()) != n:
        assert time.monotonic() < end, f"never {n} pending waits: {waits}"
        await asyncio.sleep(0.01)
    return waits


async def waiting(rt: Runtime, submission_id: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while (await rt.submission(submission_id)).status != "waiting":
        assert time.monotonic() < end, "the submission never started waiting"
        await asyncio.sleep(0.01)


async def paused(rt: Runtime, agent: str, id: str, text: str) -> tuple[Any, Any]:
    """Send ``text``; return its receipt and its one pending wait once the submission waits."""
    receipt = await rt.dispatch(agent, id, text)
    await waiting(rt, receipt.submission_id)
    [wait] = await pending(rt, 1)
    return receipt, wait


async def test_writes_made_before_and_after_the_waits_of_a_batch_all_commit_with_it(
    tmp_path: Any,
) -> None:
    RAN.clear()
    async with app(str(tmp_path / "h.db")).run() as rt:
        receipt = await rt.dispatch("clerk", "c-1", "two waits")
        await waiting(rt, receipt.submission_id)
        by_name = {w.name: w for w in await pending(rt, 2)}
        await rt.resolve("clerk", "c-1", by_name["a"].wait_id, "yes")
        # The submission waits on, for ``b``: it runs again once every wait has ended.
        await pending(rt, 1)
        assert (await rt.submission(receipt.submission_id)).status == "waiting"
        assert await rt.store.get_state("clerk/c-1") == {}  # not committed yet
        await rt.resolve("clerk", "c-1", by_name["b"].wait_id, "no")
        await rt.read(receipt, timeout=10)
        assert await rt.store.get_state("clerk/c-1") == {"notes": 1, "a": "yes", "b": "no"}
        await assert_invariants(rt.store)
    assert RAN.count("note") == 1 and RAN.count("a") == 1


async def test_writes_of_a_batch_whose_only_waiting_call_is_a_task_are_kept(
    tmp_path: Any,
) -> None:
    RAN.clear()
    db = str(tmp_path / "h.db")
    async with app(db).run() as rt:
        receipt, wait = await paused(rt, "front", "c-1", "delegate")
        assert await rt.store.get_state("front/c-1") == {}
    # Another process resumes it: what the batch wrote is in the database, not in memory.
    async with app(db).run() as rt:
        await rt.resolve(*wait.conversation_id.split("/", 1), wait.wait_id, "ok")
        await rt.read(receipt, timeout=10)
        assert await rt.store.get_state("front/c-1") == {"notes": 1}
        assert await rt.store.get_state(wait.conversation_id) == {"c": "ok"}
        await assert_invariants(rt.store)
    assert RAN.count("front-note") == 1 and RAN.count("c") == 1


async def test_writes_of_every_level_of_nested_tasks_are_kept_and_an_abort_names_the_root(
    tmp_path: Any,
) -> None:
    RAN.clear()
    async with app(str(tmp_path / "h.db")).run() as rt:
        receipt, wait = await paused(rt, "top", "t-1", "delegate deeper")
        agent, conversation = wait.conversation_id.split("/", 1)
        # The grandchild has no submission of its own; nor has its parent: the top one runs both.
        with pytest.raises(hearth.DelegatedConversation, match=r"\(abort top/t-1\)"):
            await rt.abort(agent, conversation)
        await rt.resolve(agent, conversation, wait.wait_id, "ok")
        await rt.read(receipt, timeout=10)
        assert await rt.store.get_state("top/t-1") == {"notes": 1}
        assert await rt.store.get_state(wait.conversation_id) == {"c": "ok"}
        [middle] = [c for c in await rt.conversations(agent="mid")]
        assert await rt.store.get_state(middle.conversation_id) == {"notes": 1}
        await assert_invariants(rt.store)
    assert RAN.count("top-note") == RAN.count("mid-note") == RAN.count("c") == 1
