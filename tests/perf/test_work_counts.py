"""Work that must scale with the work, not with the waiters: counted, never timed.

Each test counts store calls or wake-ups around one event (a settlement, an append, a model
turn) with many waiters or much history, so an O(N) regression fails here however fast the
machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import hearth
from hearth.records import Compaction, Record, UserMessage
from hearth.runtime.runtime import Runtime
from hearth.server.tail import EncodedEvents, follow
from hearth.store.base import NewSubmission, Submission
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


async def admit(rt: Runtime, conversation_id: str) -> Submission:
    new = NewSubmission(conversation_id, "w", "message", {"message": "hi"})
    return (await rt.store.admit(new)).submission


async def test_a_settlement_wakes_only_the_waiters_of_its_own_submission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hearth.runtime.runtime._RECHECK_S", 3600.0)  # no periodic look
    async with app().run() as rt:
        await rt.coordinator.stop()  # settle by hand
        subs = [await admit(rt, f"w/c{i}") for i in range(WAITERS)]
        rows = 0
        get_submission = rt.store.get_submission

        async def counted(submission_id: str) -> Submission | None:
            nonlocal rows
            rows += 1
            return await get_submission(submission_id)

        monkeypatch.setattr(rt.store, "get_submission", counted)
        waiters = [asyncio.create_task(rt.wait_settled(s.id)) for s in subs]
        await until(lambda: rows == WAITERS, "every waiter read its row once")
        (claimed,) = await rt.store.claim("me", 30.0, 1)
        record = settlement(claimed.id, "completed", None, "ok")
        await rt.store.settle(claimed.fence, record, outcome="completed", error=None, reply="ok")
        done = await asyncio.wait_for(waiters[0], timeout=10)
        await asyncio.sleep(0.05)  # let any other woken waiter run
        assert done.outcome == "completed"
        assert rows == WAITERS + 1  # one wake-up, one re-read, for N waiters
        assert sum(w.done() for w in waiters) == 1
        for w in waiters:
            w.cancel()


async def test_followers_of_one_conversation_share_one_store_read_per_append() -> None:
    async with app().run() as rt:
        await rt.coordinator.stop()
        sub = await admit(rt, "w/tail")
        stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seen: list[list[int]] = [[] for _ in range(WAITERS)]

        async def one(into: list[int]) -> None:
            batches: AsyncIterator[list[Record]] = follow(rt, "w/tail", -1, stop)
            async for batch in batches:
                into.extend(r.offset for r in batch)

        reads = 0
        store_read = rt.store.read

        async def counted(*args: Any, **kwargs: Any) -> list[Record]:
            nonlocal reads
            reads += 1
            return await store_read(*args, **kwargs)

        rt.store.read = counted  # type: ignore[method-assign]
        tasks = [asyncio.create_task(one(s)) for s in seen]
        await until(lambda: all(s == [0] for s in seen), "every follower caught up")
        await asyncio.sleep(0.05)  # all idle, waiting for the next append
        for n in range(1, 4):
            before = reads
            message = UserMessage(id=f"u{n}", message_id=f"u{n}", content="more")
            await rt.store.append("w/tail", [message.stamped(sub.id, 0)])
            await until(lambda n=n: all(len(s) == n + 1 for s in seen), "every follower got it")
            await asyncio.sleep(0.05)  # and went back to waiting
            assert reads - before == 1  # not one per follower
        stop.set_result(None)
        await asyncio.gather(*tasks)


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

        rt.store.read = counted  # type: ignore[method-assign]
        answer = await rt.read(await rt.dispatch("w", "long", "again"), timeout=30)
        assert answer.text == "fresh"
        return read


async def test_a_turn_reads_only_the_records_since_the_last_compaction() -> None:
    small, large = await records_read_by_one_turn(100), await records_read_by_one_turn(10_000)
    assert small == large
    assert large < 100


async def test_followers_of_one_conversation_share_one_encoding_per_record() -> None:
    events = EncodedEvents()
    async with app().run() as rt:
        await rt.coordinator.stop()
        sub = await admit(rt, "w/enc")
        stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sent: list[list[bytes]] = [[] for _ in range(WAITERS)]

        async def one(into: list[bytes]) -> None:
            async for batch in follow(rt, "w/enc", -1, stop):
                into.extend(events.event(r) for r in batch)  # what each SSE stream sends

        tasks = [asyncio.create_task(one(s)) for s in sent]
        await until(lambda: all(len(s) == 1 for s in sent), "every follower caught up")
        await asyncio.sleep(0.05)
        for n in range(1, 4):
            before = events.encoded
            message = UserMessage(id=f"u{n}", message_id=f"u{n}", content="more")
            await rt.store.append("w/enc", [message.stamped(sub.id, 0)])
            await until(lambda n=n: all(len(s) == n + 1 for s in sent), "every follower got it")
            await asyncio.sleep(0.05)
            assert events.encoded - before == 1  # not one per follower
            assert len({s[-1] for s in sent}) == 1 and b'"id":"u%d"' % n in sent[0][-1]
        stop.set_result(None)
        await asyncio.gather(*tasks)
