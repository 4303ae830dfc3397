"""SSE streams sharing one reader per conversation: every record reaches every stream exactly
once and in order, however streams join, fall behind or leave.

The streams are driven as ASGI responses with an in-memory client (what uvicorn would hand
them), over a real runtime and store, so the channel's hand-over is observed record by record.
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import pytest

import hearth
from hearth.records import UserMessage
from hearth.runtime.runtime import Runtime
from hearth.server import broadcast
from hearth.server.context import Closing
from hearth.server.tail import ConversationStream
from hearth.store.base import NewSubmission, Submission
from hearth.testing import ScriptedModel, reply

pytestmark = pytest.mark.anyio

CONVERSATION = "w/room"


def worker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/w")
    return ""


def app() -> hearth.App:
    return hearth.App(
        [hearth.Agent(worker, name="w")], db="memory", providers=[ScriptedModel("w", [reply("ok")])]
    )


class Client:
    """What an ASGI server does for one SSE response: collects the body, reports a disconnect."""

    def __init__(self, pauses: random.Random | None = None) -> None:
        self.pauses = pauses  # when given, some writes wait a moment, as a busy socket's do
        self.body = bytearray()
        self.writes = 0
        self.tried = 0  # body writes begun (a blocked one included)
        self.ended = False
        self.gone = asyncio.Event()
        self.unblocked = asyncio.Event()
        self.unblocked.set()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] != "http.response.body":
            return
        self.tried += 1
        await self.unblocked.wait()  # a client that stops reading blocks the server's write
        if self.pauses is not None and self.pauses.random() < 0.5:
            await asyncio.sleep(self.pauses.choice([0, 0, 0.001]))
        if message["body"]:
            self.body += message["body"]
            self.writes += 1
        if not message.get("more_body", False):
            self.ended = True

    def offsets(self) -> list[int]:
        return [int(found) for found in re.findall(rb"^id: (\d+)\r$", bytes(self.body), re.M)]


def start(
    rt: Runtime, after: int, closing: Closing, pauses: random.Random | None = None
) -> tuple[Client, asyncio.Task[None]]:
    client = Client(pauses)
    stream = ConversationStream(rt, CONVERSATION, after, closing, heartbeat_s=3600)
    scope = {"type": "http", "method": "GET"}
    return client, asyncio.create_task(stream(scope, client.receive, client.send))


async def until(condition: Any, what: str) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


async def admit(rt: Runtime) -> Submission:
    new = NewSubmission(CONVERSATION, "w", "message", {"message": "hi"})
    return (await rt.store.admit(new)).submission


async def append(rt: Runtime, sub: Submission, n: int) -> int:
    messages = [
        UserMessage(id=f"u{random.random()}", message_id="m", content="x").stamped(sub.id, 0)
        for _ in range(n)
    ]
    return (await rt.store.append(CONVERSATION, messages))[-1]


async def test_one_store_read_and_one_write_per_stream_per_append() -> None:
    async with app().run() as rt:
        await rt.coordinator.stop()
        sub = await admit(rt)
        closing = Closing()
        streams = [start(rt, -1, closing) for _ in range(200)]
        await until(lambda: all(c.offsets() == [0] for c, _ in streams), "all caught up")
        hub = broadcast.broadcasts(rt)
        await until(lambda: len(hub.channels[CONVERSATION].followers) == 200, "all joined")
        channel = hub.channels[CONVERSATION]
        await until(lambda: channel.idle, "the channel waits for the next append")
        reads, store_read = 0, rt.store.read_page

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await store_read(*args, **kwargs)

        rt.store.read_page = counted  # type: ignore[method-assign]
        for _ in range(3):
            writes = [c.writes for c, _ in streams]
            encoded, before = broadcast.ENCODED.encoded, reads
            last = await append(rt, sub, 1)
            await until(lambda at=last: all(c.offsets()[-1] == at for c, _ in streams), "sent")
            await until(lambda: channel.idle, "and back to waiting")
            assert reads - before == 1  # not one per stream
            assert broadcast.ENCODED.encoded - encoded == 1
            assert [c.writes - w for (c, _), w in zip(streams, writes, strict=True)] == [1] * 200
        assert channel.reads >= 3
        closing.set()
        await asyncio.wait_for(asyncio.gather(*(t for _, t in streams)), timeout=10)
        assert all(c.ended for c, _ in streams)
        await until(lambda: CONVERSATION not in hub.channels, "the channel ended")


async def test_streams_joining_while_records_arrive_see_each_record_once_in_order() -> None:
    rng = random.Random(7)
    async with app().run() as rt:
        await rt.coordinator.stop()
        sub = await admit(rt)
        closing = Closing()
        streams: list[tuple[int, Client, asyncio.Task[None]]] = []
        ends = [0]

        async def writer() -> None:
            for _ in range(60):
                ends.append(await append(rt, sub, rng.choice([1, 1, 2, 7, 600])))
                await asyncio.sleep(rng.choice([0, 0, 0.001]))

        writing = asyncio.create_task(writer())
        while not writing.done():  # streams start at any offset, at any moment of the writing
            for _ in range(rng.randint(0, 2) if len(streams) < 60 else 0):
                after = rng.randint(-1, ends[-1])
                streams.append((after, *start(rt, after, closing, rng)))
            await asyncio.sleep(0)
        last = ends[-1]
        await until(
            lambda: all(b"id: %d\r\n" % last in c.body[-2000:] for _, c, _ in streams),
            "all at the end",
        )
        for after, client, _ in streams:
            assert client.offsets() == list(range(after + 1, last + 1))
        closing.set()
        await asyncio.gather(*(t for _, _, t in streams))


async def test_a_stream_that_finished_its_own_read_after_the_channel_moved_on_reads_again() -> None:
    async with app().run() as rt:
        await rt.coordinator.stop()
        sub = await admit(rt)
        closing = Closing()
        first, first_task = start(rt, -1, closing)
        hub = broadcast.broadcasts(rt)
        await until(lambda: CONVERSATION in hub.channels, "the channel started")
        late = Client()
        late.unblocked.clear()  # it has read offset 0 and is stuck writing it
        stream = ConversationStream(rt, CONVERSATION, -1, closing, heartbeat_s=3600)
        late_task = asyncio.create_task(stream({"type": "http"}, late.receive, late.send))
        await until(lambda: late.tried == 1, "it read offset 0 and is writing it")
        one = await append(rt, sub, 1)
        await until(lambda: first.offsets()[-1:] == [one], "the channel sent offset 1")
        late.unblocked.set()  # now it joins a channel that is one record ahead of it
        two = await append(rt, sub, 1)
        await until(
            lambda: late.offsets()[-1:] == first.offsets()[-1:] == [two], "both are current"
        )
        assert late.offsets() == first.offsets() == [0, one, two]
        closing.set()
        await asyncio.gather(first_task, late_task)


async def test_a_stream_asking_past_the_end_does_not_hide_records_from_the_others() -> None:
    async with app().run() as rt:
        await rt.coordinator.stop()
        sub = await admit(rt)
        closing = Closing()
        ahead, ahead_task = start(rt, 1_000, closing)  # the first: it starts the channel
        hub = broadcast.broadcasts(rt)
        await until(lambda: CONVERSATION in hub.channels, "the channel started")
        current, current_task = start(rt, -1, closing)
        one = await append(rt, sub, 1)
        await until(lambda: current.offsets() == [0, one], "the current stream got it")
        reads, store_read = 0, rt.store.read_page

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await store_read(*args, **kwargs)

        rt.store.read_page = counted  # type: ignore[method-assign]
        await asyncio.sleep(0.1)
        assert reads == 0  # both wait, neither reads in a loop
        await append(rt, sub, 1_000)
        await until(lambda: current.offsets()[-1:] == [1_001], "and the next thousand")
        await until(lambda: ahead.offsets()[-1:] == [1_001], "the ahead one got what is after")
        assert ahead.offsets() == [1_001]
        closing.set()
        await asyncio.gather(ahead_task, current_task)


def test_the_cache_of_encoded_events_keeps_to_its_byte_budget() -> None:
    """Large records would keep gigabytes alive in a cache bounded by count alone."""
    encoded = broadcast.EncodedEvents(size=100, max_bytes=1_000)
    records = [
        UserMessage(id=f"u{i}", message_id="m", content="x" * 300).stamped("s", 0).with_offset(i)
        for i in range(10)
    ]
    for record in records:
        encoded.event(record)
    assert encoded.encoded == 10 and 300 < encoded.bytes <= 1_000
    encoded.event(records[-1])  # still cached
    assert encoded.encoded == 10
    encoded.event(records[0])  # long gone: encoded again
    assert encoded.encoded == 11 and encoded.bytes <= 1_000
    huge = UserMessage(id="h", message_id="m", content="y" * 5_000).stamped("s", 0)
    encoded.event(huge.with_offset(10))  # alone over the budget: kept until the next one
    assert encoded.bytes > 5_000
    encoded.event(records[1])
    assert encoded.bytes <= 1_000


def test_a_stream_given_records_it_already_has_keeps_only_the_new_ones() -> None:
    encoded = broadcast.EncodedEvents()
    records = [
        UserMessage(id=f"u{i}", message_id="m", content="x").stamped("s", 0).with_offset(i)
        for i in range(3, 9)
    ]
    follower = broadcast.Follower(after=5)
    whole = b"".join(encoded.event(r) for r in records)
    follower.take(records, whole, encoded)
    assert follower.drain() == b"".join(encoded.event(r) for r in records[3:])
    assert (follower.last, follower.sent) == (8, 8)
    follower.take(records, whole, encoded)  # nothing new in it
    assert follower.pending == []


async def test_a_stream_that_stops_reading_falls_back_without_holding_up_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(broadcast, "MAX_PENDING", 2_000)
    async with app().run() as rt:
        await rt.coordinator.stop()
        sub = await admit(rt)
        closing = Closing()
        (slow, slow_task), (fast, fast_task) = start(rt, -1, closing), start(rt, -1, closing)
        await until(lambda: slow.offsets() == [0] and fast.offsets() == [0], "both caught up")
        hub = broadcast.broadcasts(rt)
        await until(lambda: len(hub.channels[CONVERSATION].followers) == 2, "both joined")
        slow.unblocked.clear()
        for _ in range(30):
            last = await append(rt, sub, 3)
            await asyncio.sleep(0.001)
        await until(lambda: fast.offsets()[-1:] == [last], "the reading stream is current")
        (follower,) = hub.channels[CONVERSATION].followers  # the slow one has left the channel
        assert follower is not None
        slow.unblocked.set()
        await until(lambda: slow.offsets()[-1:] == [last], "the slow one caught up by reading")
        assert slow.offsets() == fast.offsets() == list(range(last + 1))
        await until(lambda: len(hub.channels[CONVERSATION].followers) == 2, "and joined again")
        closing.set()
        await asyncio.gather(slow_task, fast_task)


async def test_a_stream_whose_client_leaves_ends_and_the_last_one_ends_the_channel() -> None:
    async with app().run() as rt:
        await rt.coordinator.stop()
        sub = await admit(rt)
        closing = Closing()
        (a, a_task), (b, b_task) = start(rt, -1, closing), start(rt, -1, closing)
        hub = broadcast.broadcasts(rt)
        await until(
            lambda: len(getattr(hub.channels.get(CONVERSATION), "followers", ())) == 2, "joined"
        )
        a.gone.set()
        await asyncio.wait_for(a_task, timeout=10)
        last = await append(rt, sub, 1)
        await until(lambda: b.offsets()[-1:] == [last], "the other still follows")
        b.gone.set()
        await asyncio.wait_for(b_task, timeout=10)
        await until(lambda: CONVERSATION not in hub.channels, "no follower, no channel")


async def test_a_head_request_gets_the_headers_and_no_stream() -> None:
    async with app().run() as rt:
        client = Client()
        stream = ConversationStream(rt, CONVERSATION, -1, Closing(), heartbeat_s=3600)
        await asyncio.wait_for(
            stream({"type": "http", "method": "HEAD"}, client.receive, client.send), timeout=10
        )
        assert client.ended and client.body == b""


@pytest.mark.parametrize("heartbeat_s", [0.01, 0])
async def test_heartbeats_go_out_while_idle_and_zero_turns_them_off(heartbeat_s: float) -> None:
    async with app().run() as rt:
        await admit(rt)
        client = Client()
        stream = ConversationStream(rt, CONVERSATION, 0, Closing(), heartbeat_s=heartbeat_s)
        task = asyncio.create_task(stream({"type": "http"}, client.receive, client.send))
        await asyncio.sleep(0.2)
        pings = bytes(client.body).count(b": ping")
        assert (pings >= 3) if heartbeat_s else (pings == 0)
        client.gone.set()
        await asyncio.wait_for(task, timeout=10)


async def test_a_shutdown_callback_that_raises_leaves_the_others_called(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first to raise stopped the rest: the streams after it stayed open past shutdown."""
    closing, called = Closing(), []

    def broken() -> None:
        raise RuntimeError("broken")

    closing.on_set(lambda: called.append("first"))
    closing.on_set(broken)
    closing.on_set(lambda: called.append("last"))
    closing.set()
    assert called == ["first", "last"]
    assert "a shutdown callback raised" in caplog.text


def lose_notices(rt: Runtime) -> None:
    """From now on, no notice of an append or a settlement reaches this process (as when its
    PostgreSQL listener is reconnecting, or the writer died between commit and notify)."""
    from hearth.store.events import APPENDED, SETTLED

    events = rt.store.events
    publish, publish_all = events.publish, events.publish_all
    lost = (APPENDED, SETTLED)
    events.publish = lambda e: None if e.kind in lost else publish(e)  # type: ignore[method-assign]
    events.publish_all = lambda es: publish_all([e for e in es if e.kind not in lost])  # type: ignore[method-assign]
    rt.store.shared = True  # (a store of one process never loses one)


async def test_long_polls_see_what_happened_though_its_notice_was_lost() -> None:
    """Both waited only for a notice: the submission long-poll answered "unsettled" at the end
    of its wait, and the page long-poll answered only then."""
    from hearth.server.tail import json_page, wait_for_settlement

    replying = hearth.App(
        [hearth.Agent(worker, name="w")],
        db="memory",
        providers=[ScriptedModel("w", [reply("ok")], repeat_last=True)],
    )
    async with replying.run() as rt:
        receipt = await rt.dispatch("w", "room", "hello")
        await rt.read(receipt, timeout=10)
        sub = await rt.submission(receipt.submission_id)
        lose_notices(rt)
        second = await rt.dispatch("w", "room", "again")
        waiting = await rt.submission(second.submission_id)
        async with asyncio.timeout(10):  # (a bound on a hang: it waited the whole 60 s)
            done = await wait_for_settlement(rt, waiting, 60.0, Closing())
        assert done.outcome == "completed"
        end = (await rt.history("w", "room"))[-1].offset

        async def later() -> None:
            await asyncio.sleep(0.2)
            await rt.store.append(
                CONVERSATION, [UserMessage(id="late", message_id="late", content="x")]
            )

        task = asyncio.create_task(later())
        async with asyncio.timeout(10):
            page = await json_page(rt, CONVERSATION, end, 10, 60.0, Closing())
        await task
        assert [r["id"] for r in page["records"]] == ["late"]
        assert sub.outcome == "completed"
