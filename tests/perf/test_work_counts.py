"""Work that must scale with the work, not with the waiters: counted, never timed.

Each test counts store calls or wake-ups around one event (a settlement, an append, a model
turn) with many waiters or much history, so an O(N) regression fails here however fast the
machine is. SSE followers' reads and writes per append are counted in
``tests/server/test_broadcast.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import hearth
from hearth.records import Compaction, Record, UserMessage
from hearth.runtime.runtime import Runtime
from hearth.store.base import NewSubmission, Submission, TurnView
from hearth.store.rules import settlement
from hearth.testing import ScriptedModel, call, calls, reply

pytestmark = pytest.mark.anyio

WAITERS = 200


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@hearth.tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return key.upper()


def worker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/w")
    ctx.use_tool(lookup)
    return ""


def app(script: Any = None) -> hearth.App:
    return hearth.App(
        [hearth.Agent(worker, name="w")],
        db="memory",
        providers=[ScriptedModel("w", script or [reply("ok")])],
    )


async def until(condition: Any, what: str) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


class Calls:
    """How many times a counted method was called."""

    n = 0


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> Calls:
    """Count the calls of the async method ``owner.name`` from now on."""
    calls, method = Calls(), getattr(owner, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.n += 1
        return await method(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


async def admit(rt: Runtime, conversation_id: str) -> Submission:
    new = NewSubmission(conversation_id, "w", "message", {"message": "hi"})
    return (await rt.store.admit(new)).submission


async def test_a_settlement_wakes_only_the_waiters_of_its_own_submission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hearth.runtime.settled.LOOK_EVERY_S", 3600.0)  # no periodic look
    async with app().run() as rt:
        await rt.coordinator.stop()  # settle by hand
        subs = [await admit(rt, f"w/c{i}") for i in range(WAITERS)]
        rows = count_calls(monkeypatch, rt.store, "get_submission")
        waiters = [asyncio.create_task(rt.wait_settled(s.id)) for s in subs]
        await until(lambda: rows.n == WAITERS, "every waiter read its row once")
        (claimed,) = await rt.store.claim("me", 30.0, 1)
        record = settlement(claimed.id, "completed", None, "ok")
        await rt.store.settle(claimed.fence, record, outcome="completed", error=None, reply="ok")
        done = await asyncio.wait_for(waiters[0], timeout=10)
        await asyncio.sleep(0.05)  # let any other woken waiter run
        assert done.outcome == "completed"
        assert rows.n == WAITERS  # one wake-up, no re-read (the event carries the row)
        assert sum(w.done() for w in waiters) == 1
        for w in waiters:
            w.cancel()


async def test_waits_whose_settlement_events_were_lost_share_one_look_per_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A settlement's event can be lost (another process's, dying before it notified). The
    waits then learn of it from one shared read of all their rows per look, not one each."""
    monkeypatch.setattr("hearth.runtime.settled.LOOK_EVERY_S", 0.2)
    async with app().run() as rt:
        await rt.coordinator.stop()  # settle by hand
        subs = [await admit(rt, f"w/c{i}") for i in range(WAITERS)]
        reads = count_calls(monkeypatch, rt.store, "get_submission")
        looks = count_calls(monkeypatch, rt.store, "get_submissions")
        events = rt.store.events
        publish = events.publish
        monkeypatch.setattr(
            events, "publish", lambda e: None if e.kind == "settled" else publish(e)
        )  # every settlement's event is lost
        waiters = [asyncio.create_task(rt.wait_settled(s.id, timeout=30)) for s in subs]
        await until(lambda: reads.n == WAITERS, "every waiter read its row once")
        claimed = await rt.store.claim("me", 30.0, WAITERS)
        assert len(claimed) == WAITERS
        for sub in claimed:
            record = settlement(sub.id, "completed", None, "ok")
            await rt.store.settle(sub.fence, record, outcome="completed", error=None, reply="ok")
        done = await asyncio.wait_for(asyncio.gather(*waiters), timeout=10)
        assert [d.outcome for d in done] == ["completed"] * WAITERS
        assert reads.n == WAITERS  # no wait read its own row again
        assert 1 <= looks.n <= 10  # a few looks of 0.2 s, each one read of every waited row
        assert rt.settled_looks.looks == looks.n


async def test_a_read_right_after_dispatch_reads_no_row_when_this_process_settles_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with app().run() as rt:
        reads = count_calls(monkeypatch, rt.store, "get_submission")
        receipts = [await rt.dispatch("w", f"c{i}", "hi") for i in range(20)]
        answers = await asyncio.gather(*(rt.read(r, timeout=30) for r in receipts))
        assert [a.text for a in answers] == ["ok"] * 20
        assert reads.n == 0  # the settlements' events carried the rows
        # Read again later, each answer is known without a read as well; a submission this
        # process did not admit is read.
        assert (await rt.read(receipts[0], timeout=30)).text == "ok"
        assert reads.n == 0
        other = await admit(rt, "w/elsewhere")
        assert (await rt.wait_settled(other.id, timeout=30)).outcome == "completed"
        assert reads.n >= 1


async def test_a_tool_schema_is_built_once_however_many_model_requests_carry_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = 0
    schema = lookup.input_model.model_json_schema

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        nonlocal built
        built += 1
        return schema(*args, **kwargs)

    monkeypatch.setattr(lookup.input_model, "model_json_schema", counted)
    monkeypatch.setattr(lookup, "_spec", None)
    script = [calls(call("lookup", key="k")), reply("one")] * 5
    async with app(script).run() as rt:
        for i in range(5):
            await rt.read(await rt.dispatch("w", "c", f"m{i}"), timeout=30)
    assert built == 1  # ten model requests


async def records_read_by_one_turn(history: int) -> int:
    async with app(lambda _: reply("fresh")).run() as rt:
        first = await rt.dispatch("w", "long", "start")
        await rt.read(first, timeout=30)
        filler = [
            UserMessage(id=f"old{i}", message_id=f"old{i}", content="x").stamped(first.id, 1)
            for i in range(history)
        ]
        offsets = await rt.store.append("w/long", filler)
        summary = Compaction(id="cmp", summary="all of it", first_kept_offset=offsets[-1] + 1)
        await rt.store.append("w/long", [summary.stamped(first.id, 1)])
        read = 0
        store_read = rt.store.read

        async def counted(*args: Any, **kwargs: Any) -> list[Record]:
            nonlocal read
            found = await store_read(*args, **kwargs)
            read += len(found)
            return found

        turn_view = rt.store.turn_view

        async def counted_view(*args: Any, **kwargs: Any) -> TurnView:
            nonlocal read
            found = await turn_view(*args, **kwargs)
            read += len(found.records)
            return found

        rt.store.read = counted  # type: ignore[method-assign]
        rt.store.turn_view = counted_view  # type: ignore[method-assign]
        answer = await rt.read(await rt.dispatch("w", "long", "again"), timeout=30)
        assert answer.text == "fresh"
        return read


async def test_a_turn_reads_only_the_records_since_the_last_compaction() -> None:
    small, large = await records_read_by_one_turn(100), await records_read_by_one_turn(10_000)
    assert small == large
    assert large < 100
