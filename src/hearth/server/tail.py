"""Tailing a conversation over HTTP: SSE that stays open, JSON pages, long-polls.

Live tailing needs no database polling: before each read, a waiter is armed with
``Runtime.next_append``, so an append committed while the read runs still wakes the reader.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent

from hearth.errors import StoreError
from hearth.records import Record
from hearth.runtime.runtime import Runtime
from hearth.server.context import Closing
from hearth.store.base import Submission

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

PAGE_LIMIT = 1000  # records in one JSON page
MAX_WAIT_S = 300.0  # the longest long-poll (?wait=); longer is refused (400)
MAX_OFFSET = 2**62  # far past any real stream, and inside every database's integer
_SSE_BATCH = 500  # records read per step while an SSE stream catches up
_RECHECK_S = 5.0  # how often an idle reader looks at ``shutting_down`` set from elsewhere


def record_json(record: Record) -> str:
    return json.dumps(record.to_json(), separators=(",", ":"), ensure_ascii=False)


class EncodedEvents:
    """The SSE bytes of recently sent records, made once however many followers send them.

    Followers woken by one append share one read, so they hold the same record objects: the
    key is the object's identity, and the entry keeps the object alive so that its id cannot be
    reused while it is cached.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.encoded = 0  # events encoded (not served from the cache): what a test counts
        self._by_id: dict[int, tuple[Record, bytes]] = {}

    def event(self, record: Record) -> bytes:
        hit = self._by_id.get(id(record))
        if hit is not None and hit[0] is record:
            return hit[1]
        data = ServerSentEvent(data=record_json(record), id=str(record.offset)).encode()
        self.encoded += 1
        self._by_id[id(record)] = (record, data)
        if len(self._by_id) > self.size:
            del self._by_id[next(iter(self._by_id))]  # the oldest entry (dicts keep order)
        return data


ENCODED = EncodedEvents()


async def _until_woken(
    woken: asyncio.Future[int], also: asyncio.Future[Any], timeout: float | None
) -> None:
    """Until an append wakes ``woken``, ``also`` completes, or ``timeout`` passes."""
    await asyncio.wait({woken, also}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)


async def follow(
    runtime: Runtime, conversation_id: str, after: int, stop: asyncio.Future[Any]
) -> AsyncIterator[list[Record]]:
    """Batches of committed records after ``after``, live, until ``stop`` is done.

    The waiter is armed before each read and kept while the batch is handed on, so a short batch
    needs no second read to learn it was the last: an append since then has fired the waiter.
    Followers woken by one append read through ``Runtime.read_stream``, which shares one store
    read among them.
    """
    last = after
    while not stop.done() and not runtime.shutting_down:
        with runtime.next_append(conversation_id) as woken:
            batch = await runtime.read_stream(conversation_id, last, _SSE_BATCH)
            if batch:
                yield batch
                last = batch[-1].offset
                if len(batch) == _SSE_BATCH:
                    continue  # maybe more already: read on
            await _until_woken(woken, stop, _RECHECK_S)


class _CountedStream(EventSourceResponse):
    """An SSE response that gives its slot back once it has ended, however it ends (also when
    the client left before the first event)."""

    def __init__(self, *args: Any, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def sse_response(
    runtime: Runtime,
    conversation_id: str,
    after: int,
    closing: Closing,
    heartbeat_s: float,
    release: Callable[[], None] = lambda: None,
) -> EventSourceResponse:
    """One SSE event per committed record after ``after``; stays open, tails live. ``release``
    is called once when the stream has ended (the caller counted it open)."""
    shutdown = anyio.Event()  # set by sse-starlette when the ASGI server itself is exiting

    async def events() -> AsyncIterator[bytes]:
        stop = closing.watch(shutdown.wait)
        try:
            async for batch in follow(runtime, conversation_id, after, stop):
                # One send per batch: a follower that fell behind catches up in one write.
                yield b"".join(ENCODED.event(record) for record in batch)
        except StoreError:
            return  # the store closed under us: the server is going away
        finally:
            stop.cancel()

    return _CountedStream(
        events(),
        release=release,
        ping=heartbeat_s,
        headers={"Cache-Control": "no-store"},
        shutdown_event=shutdown,
        shutdown_grace_period=1.0,
    )


async def json_page(
    runtime: Runtime,
    conversation_id: str,
    after: int,
    limit: int,
    wait: float,
    closing: Closing,
) -> dict[str, Any]:
    """Up to ``limit`` records after ``after``; with ``wait``, long-poll for the first one."""
    deadline = time.monotonic() + wait
    stop = closing.watch()
    try:
        while True:
            with runtime.next_append(conversation_id) as woken:
                records = await runtime.read_stream(conversation_id, after, limit + 1)
                left = deadline - time.monotonic()
                if records or left <= 0 or stop.done():
                    break
                await _until_woken(woken, stop, left)
    finally:
        stop.cancel()
    more = len(records) > limit
    records = records[:limit]
    return {
        "records": [r.to_json() for r in records],
        "next_offset": records[-1].offset if records else after,
        "up_to_date": not more,
    }


async def wait_for_settlement(
    runtime: Runtime, sub: Submission, wait: float, closing: Closing
) -> Submission:
    """The submission once settled, or as it stands after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    stop = closing.watch()
    try:
        while sub.outcome is None:
            with runtime.next_append(sub.conversation_id) as woken:
                sub = await runtime.submission(sub.id)  # the settlement is an append: re-read
                left = deadline - time.monotonic()
                if sub.outcome is not None or left <= 0 or stop.done():
                    break
                await _until_woken(woken, stop, left)
    finally:
        stop.cancel()
    return sub
