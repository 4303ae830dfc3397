"""Tailing a conversation over HTTP: SSE that stays open, JSON pages, long-polls.

Live tailing needs no database polling: before each read, a waiter is armed with
``Runtime.next_append``, so an append committed while the read runs still wakes the reader.
SSE streams share one such reader per conversation (``hearth.server.broadcast``).
"""

from __future__ import annotations

import asyncio
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sse_starlette import ServerSentEvent
from starlette.responses import Response

from hearth.errors import ShuttingDown, StoreError
from hearth.runtime.runtime import Runtime
from hearth.runtime.settled import LOOK_EVERY_S
from hearth.server.broadcast import BATCH, ENCODED, MAX_PENDING, Follower, broadcasts
from hearth.server.context import Closing
from hearth.server.protocol import ABORT_KEY
from hearth.store.base import Submission

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

T = TypeVar("T")

# What one stream reads for itself while it catches up, and holds while its client is slow to
# take it: as much as it may hold pending once it follows its conversation's channel.
CATCH_UP_BYTES = MAX_PENDING
WRITE_PIECE = 64 << 10  # the most bytes written to a stream at once
# A write its client has not taken in this long ends the stream (its connection is dropped):
# a client that stopped reading, or a dead network path, would hold its slot for good.
WRITE_TIMEOUT_S = 60.0
PAGE_LIMIT = 1000  # records in one JSON page
PAGE_BYTES = 4 << 20  # and their size: a page ends after the record that reaches it
MAX_WAIT_S = 300.0  # the longest long-poll (?wait=); longer is refused (400)
MAX_OFFSET = 2**62  # far past any real stream, and inside every database's integer


async def _until_woken(
    woken: asyncio.Future[int], also: asyncio.Future[Any], timeout: float | None
) -> None:
    """Until an append wakes ``woken``, ``also`` completes, or ``timeout`` passes."""
    await asyncio.wait({woken, also}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)


_PING = ServerSentEvent(comment="ping").encode()


class ConversationStream(Response):
    """``text/event-stream`` of a conversation's records after ``after``; stays open, tails live.

    The stream reads the store itself until it has caught up, then joins its conversation's
    channel (``hearth.server.broadcast``), which reads each later append once for every stream.
    A comment line goes out every ``heartbeat_s`` (0: never) so proxies keep the connection
    open. The stream ends when the client leaves or the server closes (``closing``); ``release``
    is called once it has ended, however it ended. A write its client has not taken within
    ``WRITE_TIMEOUT_S``, or at all once the server closes, drops the connection where the
    server offers a way to (hearth's own does): the stream then ends at once.
    """

    write_timeout_s = WRITE_TIMEOUT_S
    _abort: Callable[[], None] | None = None
    _writing = False  # (a write waits for its client)

    media_type = "text/event-stream"

    def __init__(
        self,
        runtime: Runtime,
        conversation_id: str,
        after: int,
        closing: Closing,
        heartbeat_s: float,
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(
            {"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"}
        )
        self.runtime = runtime
        self.conversation_id = conversation_id
        self.after = after
        self.closing = closing
        self.heartbeat_s = heartbeat_s
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._abort = scope.get(ABORT_KEY)
        if self._abort is not None:
            send = self._bounded(send)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if scope.get("method") != "HEAD":  # HEAD: the headers only, never a stream
                await self._stream(receive, send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-write
        finally:
            self._release()

    async def _stream(self, receive: Receive, send: Send) -> None:
        follower = Follower(self.after)
        loop = asyncio.get_running_loop()
        watcher = client_gone(receive)
        watcher.add_done_callback(lambda done: _closed_by(done, follower))
        stop_closing = self.closing.on_set(lambda: self._close(follower))
        pinger = _Pinger(loop, follower, self.heartbeat_s) if self.heartbeat_s > 0 else None
        try:
            await self._serve(follower, send)
        finally:
            if pinger is not None:
                pinger.cancel()
            stop_closing()
            watcher.cancel()
            if follower.channel is not None:
                follower.channel.leave(follower)

    def _bounded(self, send: Send) -> Send:
        """``send``, dropping the connection when a write waits past its time: at once while
        the server closes, else after ``write_timeout_s``."""
        loop = asyncio.get_running_loop()

        async def bounded(message: Message) -> None:
            wait = 0.0 if self.closing.is_set() else self.write_timeout_s
            timer = loop.call_later(wait, self._drop)  # (cancelled unless the write waits)
            self._writing = True
            try:
                await send(message)
            finally:
                self._writing = False
                timer.cancel()

        return bounded

    def _close(self, follower: Follower) -> None:
        follower.close()
        if self._writing:
            self._drop()  # a write waiting for a client that does not read: end it now

    def _drop(self) -> None:
        # The waiting send returns once the connection is gone, and every later one at once.
        if self._abort is not None:
            self._abort()

    async def _serve(self, follower: Follower, send: Send) -> None:
        runtime, hub = self.runtime, broadcasts(self.runtime)
        while not follower.closed and not runtime.shutting_down:
            if follower.pending:
                await _write(send, follower.drain())
            elif follower.ping_due:
                follower.ping_due = False
                await _write(send, _PING)
            elif follower.channel is None:
                # Catching up alone: read the store until this stream has what the channel has.
                try:
                    batch, more = await runtime.read_stream(
                        self.conversation_id, follower.last, BATCH, CATCH_UP_BYTES
                    )
                    start = None
                    if not batch and self.conversation_id not in hub.channels:
                        # It may have asked for an offset past the end: a channel it starts
                        # must still read from the end, or later streams would miss the rest.
                        info = await runtime.conversation_info(self.conversation_id)
                        start = None if info is None else min(follower.last, info.last_offset)
                except StoreError:
                    return  # the store closed under us: the server is going away
                if batch:
                    follower.last = follower.sent = batch[-1].offset
                    await _write(send, b"".join(ENCODED.event(record) for record in batch))
                    if more:
                        continue
                hub.join(self.conversation_id, follower, start)
            else:
                await follower.sleep()


async def _write(send: Send, data: bytes) -> None:
    # In pieces: the server waits for a slow client to take each one before it buffers the
    # next, so a client that stops reading holds at most one piece more in its buffer.
    for start in range(0, len(data), WRITE_PIECE):
        piece = data[start : start + WRITE_PIECE]
        await send({"type": "http.response.body", "body": piece, "more_body": True})


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _closed_by(watcher: asyncio.Future[None], follower: Follower) -> None:
    """The client left (or the server could not tell us more): the stream ends."""
    if not watcher.cancelled():
        watcher.exception()  # retrieved: a server whose receive raises ends the stream quietly
    follower.close()


class _Pinger:
    """Marks a ping due on ``follower`` every ``interval`` seconds (one timer, no task)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, follower: Follower, interval: float):
        self.loop, self.follower, self.interval = loop, follower, interval
        self.handle = loop.call_later(interval, self._tick)

    def _tick(self) -> None:
        self.follower.ping()
        self.handle = self.loop.call_later(self.interval, self._tick)

    def cancel(self) -> None:
        self.handle.cancel()


def client_gone(receive: Receive | None) -> asyncio.Future[None]:
    """A future done once the client of a request has gone (a long-poll's client that hung up
    must not hold the poll, and its reads, for the rest of its ``wait``); never done without
    ``receive``. Cancel it when the request is answered."""
    if receive is None:
        return asyncio.get_running_loop().create_future()
    return asyncio.ensure_future(_until_disconnect(receive))


async def json_page(
    runtime: Runtime,
    conversation_id: str,
    after: int,
    limit: int,
    wait: float,
    closing: Closing,
    receive: Receive | None = None,
) -> dict[str, Any]:
    """Up to ``limit`` records after ``after``; with ``wait``, long-poll for the first one.

    On a store that processes share, the notice of another process's append can be lost (its
    process died after the commit, this one's listener was reconnecting): the poll then reads
    again every ``LOOK_EVERY_S`` too, rather than wait out its whole ``wait``."""
    deadline = time.monotonic() + wait
    look = LOOK_EVERY_S if runtime.store.shared else None
    stop = closing.watch()
    gone = client_gone(receive if wait > 0 else None)
    either = asyncio.ensure_future(asyncio.wait({stop, gone}, return_when=FIRST_COMPLETED))
    try:
        while True:
            with runtime.next_append(conversation_id) as woken:
                records, more = await runtime.read_stream(conversation_id, after, limit, PAGE_BYTES)
                left = deadline - time.monotonic()
                if records or left <= 0 or stop.done() or gone.done():
                    break
                await _until_woken(woken, either, left if look is None else min(left, look))
    finally:
        for pending in (stop, gone, either):
            pending.cancel()
    return {
        "records": [r.to_json() for r in records],
        "next_offset": records[-1].offset if records else after,
        "up_to_date": not more,
    }


async def unless_closing(work: Awaitable[T], closing: Closing, receive: Receive | None = None) -> T:
    """``await work``, given up (cancelled) once the server closes, ``ShuttingDown`` then, or
    once the client has gone (nobody is left to answer). For a request that may be held (an
    early answer to a wait): a shutdown must not wait for it, nor answer it as refused."""
    task = asyncio.ensure_future(work)
    stop = closing.watch()
    gone = client_gone(receive)
    try:
        waits: set[asyncio.Future[Any]] = {task, stop, gone}
        await asyncio.wait(waits, return_when=FIRST_COMPLETED)
    finally:
        stop.cancel()
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if not task.cancelled():
        return task.result()  # (done before the cancel reached it: answered as done)
    raise ShuttingDown("the server is shutting down: send the request again to the next one")


async def wait_for_settlement(
    runtime: Runtime,
    sub: Submission,
    wait: float,
    closing: Closing,
    receive: Receive | None = None,
) -> Submission:
    """The submission once settled, or as it stands after ``wait`` seconds (or once the server
    closes). It waits as ``Runtime.wait_settled`` does, so a settlement whose notice was lost
    is still seen within a second."""
    if sub.outcome is not None:
        return sub
    stop = closing.watch()
    gone = client_gone(receive)
    settled = asyncio.ensure_future(runtime.wait_settled(sub.id, wait))
    try:
        waits: set[asyncio.Future[Any]] = {settled, stop, gone}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        gone.cancel()
        if not settled.done():
            settled.cancel()
    if settled.done() and not settled.cancelled() and settled.exception() is None:
        return settled.result()
    return await runtime.submission(sub.id)  # (not settled: the row as it stands now)
