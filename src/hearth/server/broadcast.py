"""One reader per followed conversation, fanning each append out to every SSE stream on it.

A stream first catches up on its own, reading the store from its offset. Once it has read
everything its conversation's ``Channel`` has sent, it joins the channel; from then on the
channel's single task reads each append once, encodes it once, and hands the same bytes to
every joined stream. Handing over is a list append and, for a stream that was idle, one wake-up:
an append costs one store read and one encoding whatever the number of followers, and each
follower only writes bytes to its socket.

A stream whose client reads too slowly to keep up leaves the channel once its unsent bytes pass
``MAX_PENDING`` and catches up by reading the store again, in reads of about that much, written
in pieces the server waits for the client to take: a stalled client costs memory for about that
much (the records of one read, and their encoding), not for what it has yet to read.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import weakref
from asyncio import FIRST_COMPLETED
from typing import Any

from sse_starlette import ServerSentEvent

from hearth.errors import StoreError
from hearth.records import Record
from hearth.runtime.runtime import Runtime

log = logging.getLogger("hearth.server")

BATCH = 500  # records read per store read, by a channel or a catching-up stream
BATCH_BYTES = 4 << 20  # and their size: a read ends after the record that reaches it
MAX_PENDING = 1 << 20  # unsent bytes a stream may hold before it falls back to reading
RECHECK_S = 5.0  # how often an idle channel looks at ``shutting_down`` set from elsewhere


def record_json(record: Record) -> str:
    return json.dumps(record.to_json(), separators=(",", ":"), ensure_ascii=False)


class EncodedEvents:
    """The SSE bytes of recently sent records, made once however many followers send them.

    Followers woken by one append share one read, so they hold the same record objects: the
    key is the object's identity, and the entry keeps the object alive so that its id cannot be
    reused while it is cached. At most ``size`` entries and about ``max_bytes`` of events are
    kept (large records would otherwise keep gigabytes alive).
    """

    def __init__(self, size: int = 4096, max_bytes: int = 32 << 20) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.encoded = 0  # events encoded (not served from the cache): what a test counts
        self.bytes = 0  # the size of the events cached now
        self._by_id: dict[int, tuple[Record, bytes]] = {}

    def event(self, record: Record) -> bytes:
        hit = self._by_id.get(id(record))
        if hit is not None and hit[0] is record:
            return hit[1]
        data = ServerSentEvent(data=record_json(record), id=str(record.offset)).encode()
        self.encoded += 1
        if hit is not None:
            self.bytes -= len(hit[1])
        self._by_id[id(record)] = (record, data)
        self.bytes += len(data)
        while len(self._by_id) > 1 and (
            len(self._by_id) > self.size or self.bytes > self.max_bytes
        ):
            oldest = next(iter(self._by_id))  # dicts keep order
            self.bytes -= len(self._by_id.pop(oldest)[1])
        return data


ENCODED = EncodedEvents()


class Follower:
    """One open stream's place in the conversation: what it has been given and not yet sent."""

    __slots__ = (
        "_wake",
        "channel",
        "closed",
        "last",
        "pending",
        "pending_bytes",
        "ping_due",
        "sent",
    )

    def __init__(self, after: int) -> None:
        self.last = after  # the last offset handed to this stream (sent or pending)
        self.sent = after  # the last offset written to its socket, or being written now
        self.pending: list[tuple[int, bytes]] = []  # (last offset, SSE bytes), oldest first
        self.pending_bytes = 0
        self.channel: Channel | None = None
        self.closed = False
        self.ping_due = False
        self._wake: asyncio.Future[None] | None = None

    def take(self, batch: list[Record], data: bytes, encoded: EncodedEvents) -> None:
        """Queue the part of ``batch`` (encoded as ``data``) after what this stream has."""
        end = batch[-1].offset
        if end <= self.last:
            return
        if batch[0].offset <= self.last:  # it read some of these itself before it joined
            data = b"".join(encoded.event(r) for r in batch if r.offset > self.last)
        self.pending.append((end, data))
        self.pending_bytes += len(data)
        self.last = end
        self.wake()

    def drain(self) -> bytes:
        """Everything pending, as one write; marks it sent."""
        data = b"".join(chunk for _, chunk in self.pending)
        self.sent = self.pending[-1][0]
        self.pending.clear()
        self.pending_bytes = 0
        return data

    def wake(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def close(self) -> None:
        self.closed = True
        self.wake()

    def ping(self) -> None:
        self.ping_due = True
        self.wake()

    async def sleep(self) -> None:
        """Until something is queued, a ping is due, or the stream is closed."""
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake
        finally:
            self._wake = None


class Channel:
    """The followers of one conversation and the task that reads its appends for all of them."""

    def __init__(
        self, hub: Broadcasts, conversation_id: str, last: int, encoded: EncodedEvents
    ) -> None:
        self.hub = hub
        self.conversation_id = conversation_id
        self.last = last  # the last offset handed to the followers
        self.encoded = encoded
        self.followers: set[Follower] = set()
        self.reads = 0  # batches read: what a test counts
        self.idle = False  # waiting for the next append (what a test waits for)
        self._empty: asyncio.Future[None] | None = None
        # (in a context of its own: not the first follower's request's, for every follower)
        self.task = asyncio.create_task(self._run(), context=contextvars.Context())

    def leave(self, follower: Follower) -> None:
        self.followers.discard(follower)
        follower.channel = None
        if not self.followers and self._empty is not None and not self._empty.done():
            self._empty.set_result(None)

    async def _run(self) -> None:
        runtime = self.hub.runtime
        try:
            while self.followers and not runtime.shutting_down:
                with runtime.next_append(self.conversation_id) as woken:
                    batch, more = await runtime.read_stream(
                        self.conversation_id, self.last, BATCH, BATCH_BYTES
                    )
                    self.reads += 1
                    if batch:
                        self._fan_out(batch)
                        if more:
                            continue
                    if not self.followers:
                        break
                    empty = self._empty = asyncio.get_running_loop().create_future()
                    waits: set[asyncio.Future[Any]] = {woken, empty}
                    self.idle = True
                    await asyncio.wait(waits, timeout=RECHECK_S, return_when=FIRST_COMPLETED)
                    self.idle, self._empty = False, None
        except StoreError:
            pass  # the store closed under us: the server is going away
        except Exception:
            log.exception(
                "the stream reader of %s failed; closing its streams", self.conversation_id
            )
        finally:
            self.hub.ended(self)
            for follower in list(self.followers):
                self.leave(follower)
                follower.close()

    def _fan_out(self, batch: list[Record]) -> None:
        data = b"".join(self.encoded.event(record) for record in batch)
        self.last = batch[-1].offset
        for follower in list(self.followers):
            follower.take(batch, data, self.encoded)
            if follower.pending_bytes > MAX_PENDING:
                # Too slow to keep up: drop what it was given and let it read the store again.
                follower.pending.clear()
                follower.pending_bytes = 0
                follower.last = follower.sent
                self.leave(follower)


class Broadcasts:
    """A runtime's channels, one per conversation that has streams following it."""

    def __init__(self, runtime: Runtime, encoded: EncodedEvents) -> None:
        self.runtime = runtime
        self.encoded = encoded
        self.channels: dict[str, Channel] = {}

    def join(self, conversation_id: str, follower: Follower, start: int | None = None) -> bool:
        """Join the conversation's channel if ``follower`` has everything the channel has sent;
        False when it must read the store again first. With no channel, one starts reading after
        ``start`` (default: what the follower has; never past the stream's end)."""
        channel = self.channels.get(conversation_id)
        if channel is None:
            last = follower.last if start is None else start
            channel = self.channels[conversation_id] = Channel(
                self, conversation_id, last, self.encoded
            )
        elif channel.last > follower.last:
            return False
        channel.followers.add(follower)
        follower.channel = channel
        return True

    def ended(self, channel: Channel) -> None:
        if self.channels.get(channel.conversation_id) is channel:
            del self.channels[channel.conversation_id]


_HUBS: weakref.WeakKeyDictionary[Runtime, Broadcasts] = weakref.WeakKeyDictionary()


def broadcasts(runtime: Runtime) -> Broadcasts:
    """The runtime's channels (made on first use), encoding through ``ENCODED``."""
    hub = _HUBS.get(runtime)
    if hub is None:
        hub = _HUBS[runtime] = Broadcasts(runtime, ENCODED)
    return hub
