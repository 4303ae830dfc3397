"""Messages that arrive while a conversation is busy join the live response at a turn boundary."""

from __future__ import annotations

import asyncio

import pytest

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.records import SubmissionSettled, ToolResultsCommitted, UserMessage
from hearth.testing import ScriptedModel, Step, call, calls, reply, stream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def users(request: ModelRequest) -> list[str]:
    return [str(m.content) for m in request.messages if isinstance(m, UserTurn)]


def gated_app(
    gate: asyncio.Event, entered: asyncio.Event, channels: list[hearth.Channel] | None = None
) -> tuple[hearth.App, ScriptedModel]:
    @hearth.tool
    async def work() -> str:
        """Work until the gate opens."""
        entered.set()
        await gate.wait()
        return "worked"

    @hearth.agent
    def busy(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/busy")
        ctx.use_tool(work)
        return ""

    def script(request: ModelRequest) -> Step:
        if isinstance(request.messages[-1], ToolResult) or len(users(request)) > 1:
            return reply("answered: " + " + ".join(users(request)))
        return calls(call("work"))

    model = ScriptedModel("busy", script)
    app = hearth.App([busy], db="memory", providers=[model], channels=channels or [])
    return app, model


async def test_a_message_admitted_while_busy_joins_at_the_next_turn_boundary() -> None:
    gate, entered = asyncio.Event(), asyncio.Event()
    app, model = gated_app(gate, entered)
    async with app.run() as rt:
        host = await rt.dispatch("busy", "c", "first")
        await asyncio.wait_for(entered.wait(), 10)
        joiner = await rt.dispatch("busy", "c", "second")
        third = await rt.dispatch("busy", "c", "third")
        gate.set()
        replies = [await rt.read(r, timeout=10) for r in (host, joiner, third)]
        history = await rt.history("busy", "c")
        subs = {s.id: s for s in await rt.store.list_submissions("busy/c")}
        # The joined ones are settled submissions too (admitted 3, settled 1 in the metric).
        assert rt.env.metrics.settled_by_outcome == {"completed": 3}
    assert {r.text for r in replies} == {"answered: first + second + third"}
    assert [r.outcome for r in replies] == ["completed"] * 3
    assert subs[joiner.submission_id].status == "joined"
    assert subs[joiner.submission_id].joined_to == host.submission_id
    kinds = [r.type for r in history if isinstance(r, UserMessage | ToolResultsCommitted)]
    assert kinds == ["user_message", "tool_results_committed", "user_message", "user_message"]
    assert [str(r.content) for r in history if isinstance(r, UserMessage)] == [
        "first",
        "second",
        "third",
    ]
    settled = [r.submission_id for r in history if isinstance(r, SubmissionSettled)]
    assert sorted(settled) == sorted(
        [host.submission_id, joiner.submission_id, third.submission_id]
    )
    assert len(model.requests) == 2


async def test_a_message_that_misses_the_live_response_runs_as_its_own_submission() -> None:
    @hearth.agent
    def talker(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/talk")
        return ""

    model = ScriptedModel("talk", lambda req: stream("re: ", users(req)[-1], delay=0.05))
    async with hearth.App([talker], db="memory", providers=[model]).run() as rt:
        first = await rt.dispatch("talker", "c", "one")
        second = await rt.dispatch("talker", "c", "two")
        assert (await rt.read(first, timeout=10)).text == "re: one"
        assert (await rt.read(second, timeout=10)).text == "re: two"
        subs = await rt.store.list_submissions("talker/c")
    assert [s.status for s in subs] == ["settled", "settled"]


async def test_a_queued_message_aborted_before_it_joins_settles_aborted() -> None:
    gate, entered = asyncio.Event(), asyncio.Event()
    app, _ = gated_app(gate, entered)
    async with app.run() as rt:
        host = await rt.dispatch("busy", "c", "first")
        await asyncio.wait_for(entered.wait(), 10)
        queued = await rt.dispatch("busy", "c", "second")
        await rt.abort("busy", "c")
        for receipt in (host, queued):
            with pytest.raises(hearth.SubmissionAborted):
                await rt.read(receipt, timeout=10)
        history = await rt.history("busy", "c")
    assert [str(r.content) for r in history if isinstance(r, UserMessage)] == ["first"]


async def test_a_message_from_a_channel_joins_like_a_direct_one() -> None:
    def verify(headers: object, body: bytes) -> hearth.Delivery:
        return hearth.Delivery(id=body.decode(), type="mail", data={})

    def receive(delivery: hearth.Delivery) -> hearth.Dispatch:
        if delivery.id == "signal":  # a signal never joins: it waits for its own turn
            return hearth.Dispatch("busy", "c", signal={"type": "ping", "body": "later"})
        return hearth.Dispatch("busy", "c", message=f"mail {delivery.id}")

    gate, entered = asyncio.Event(), asyncio.Event()
    mail = hearth.Channel("mail", verify=verify, receive=receive)
    app, _ = gated_app(gate, entered, [mail])
    async with app.run() as rt:
        host = await rt.dispatch("busy", "c", "first")
        await asyncio.wait_for(entered.wait(), 10)
        [joiner] = (await rt.deliver("mail", {}, b"m-1")).submission_ids
        [signal] = (await rt.deliver("mail", {}, b"signal")).submission_ids
        gate.set()
        assert (await rt.read(host, timeout=10)).text == "answered: first + mail m-1"
        await rt.read(signal, timeout=10)
        subs = {s.id: s for s in await rt.store.list_submissions("busy/c")}
    assert (subs[joiner].status, subs[joiner].joined_to) == ("joined", host.submission_id)
    assert subs[signal].status == "settled" and subs[signal].joined_to is None
