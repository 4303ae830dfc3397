"""Event hooks: on_agent_start and on_agent_finish seams."""

from __future__ import annotations

from typing import Any

import pytest

import hearth
from hearth.providers.base import ModelRequest, SystemNote, UserTurn
from hearth.records import HookSeamCommitted, Signal, StateWrite
from hearth.runtime.hooks import AgentFinish, AgentStart
from hearth.testing import ScriptedModel, Step, reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def run_app(agent: hearth.Agent, model: ScriptedModel) -> hearth.App:
    return hearth.App([agent], db="memory", providers=[model])


async def test_on_agent_start_runs_once_per_input_before_the_model_reads_it() -> None:
    seen: list[Any] = []
    model = ScriptedModel("m", lambda req: reply(f"requests so far: {len(seen)}"))

    @hearth.agent
    def greeter(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")

        @ctx.on_agent_start
        async def started(event: AgentStart) -> None:
            seen.append((event.conversation_id, event.input, len(model.requests)))

        return ""

    async with run_app(greeter, model).run() as rt:
        await rt.read(await rt.dispatch("greeter", "c", "one"), timeout=10)
        await rt.read(await rt.dispatch("greeter", "c", "two"), timeout=10)
        history = await rt.history("greeter", "c")
    assert seen == [("greeter/c", "one", 0), ("greeter/c", "two", 1)]
    seams = [r for r in history if isinstance(r, HookSeamCommitted)]
    assert [s.hook for s in seams] == ["on_agent_start", "on_agent_start"]


async def test_a_hook_state_write_commits_with_its_seam() -> None:
    @hearth.agent
    def once(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")
        sent, set_sent = ctx.use_state("welcome_sent", False)

        @ctx.on_agent_start
        def welcome(event: AgentStart) -> None:
            if not sent:
                set_sent(True)

        return f"sent={sent}"

    model = ScriptedModel("m", lambda req: reply(req.system))
    async with run_app(once, model).run() as rt:
        first = await rt.read(await rt.dispatch("once", "c", "hi"), timeout=10)
        second = await rt.read(await rt.dispatch("once", "c", "again"), timeout=10)
        history = await rt.history("once", "c")
    assert (first.text, second.text) == ("sent=True", "sent=True")
    (write,) = [r for r in history if isinstance(r, StateWrite)]
    seam = next(r for r in history if isinstance(r, HookSeamCommitted))
    assert write.offset == seam.offset - 1  # one append batch: the write, then the seam


async def test_on_agent_finish_can_continue_the_response() -> None:
    def script(request: ModelRequest) -> Step:
        notes = [m for m in request.messages if isinstance(m, SystemNote)]
        return reply(f"answer {len(notes)}")

    @hearth.agent
    def checker(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")

        @ctx.on_agent_finish
        def more(event: AgentFinish) -> None:
            if event.text != "answer 2":
                event.append("Please also double-check.")

        return ""

    async with run_app(checker, ScriptedModel("m", script)).run() as rt:
        result = await rt.read(await rt.dispatch("checker", "c", "go"), timeout=10)
        history = await rt.history("checker", "c")
    assert result.text == "answer 2"
    continuations = [
        r for r in history if isinstance(r, Signal) and r.signal_type == "continuation"
    ]
    assert [c.body for c in continuations] == ["Please also double-check."] * 2


async def test_continuations_stop_at_32() -> None:
    @hearth.agent
    def forever(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")

        @ctx.on_agent_finish
        def again(event: AgentFinish) -> None:
            event.append("more")

        return ""

    model = ScriptedModel("m", lambda req: reply("x"))
    async with run_app(forever, model).run() as rt:
        await rt.read(await rt.dispatch("forever", "c", "go"), timeout=30)
        history = await rt.history("forever", "c")
    assert sum(isinstance(r, Signal) and r.signal_type == "continuation" for r in history) == 32
    assert len(model.requests) == 33


async def test_a_raising_hook_fails_the_submission_with_hook_error() -> None:
    @hearth.agent
    def broken(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")

        @ctx.on_agent_start
        def explode(event: AgentStart) -> None:
            raise RuntimeError("mail server down")

        return ""

    model = ScriptedModel("m", [reply("never")])
    async with run_app(broken, model).run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as info:
            await rt.read(await rt.dispatch("broken", "c", "go"), timeout=10)
    assert info.value.type == "hook_error" and "mail server down" in str(info.value)
    assert model.requests == []


async def test_the_model_reads_the_input_after_the_start_hook() -> None:
    order: list[str] = []

    def script(request: ModelRequest) -> Step:
        order.append(
            "model:" + str([m.content for m in request.messages if isinstance(m, UserTurn)])
        )
        return reply("ok")

    @hearth.agent
    def ordered(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")
        ctx.on_agent_start(lambda event: order.append(f"hook:{event.input}"))
        return ""

    async with run_app(ordered, ScriptedModel("m", script)).run() as rt:
        await rt.read(await rt.dispatch("ordered", "c", "hello"), timeout=10)
    assert order == ["hook:hello", "model:['hello']"]
