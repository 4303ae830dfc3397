"""One store read for every follower of a conversation that asks for the same records.

When an append wakes N followers of one conversation, each asks for the records after the same
offset. The first request reads the store; the others, arriving while that read is in flight,
share its answer — unless an append was published since that read started, because the read may
have missed it (a follower that armed its waiter after that append would then never hear of it).
"""

from __future__ import annotations

import asyncio

from hearth.records import Record
from hearth.store.base import Store

_Key = tuple[str, int, int, int]
Page = tuple[list[Record], bool]  # the records, and whether more follow them


class SharedReads:
    """Single-flight reads of a conversation's stream (``Store.read_page``), keyed by
    (conversation, after, limit, max_bytes)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0  # store reads issued: what a counting test observes
        self._inflight: dict[_Key, tuple[asyncio.Future[int], asyncio.Future[Page]]] = {}

    async def read(self, conversation_id: str, after: int, limit: int, max_bytes: int) -> Page:
        key = (conversation_id, after, limit, max_bytes)
        shared = self._inflight.get(key)
        if shared is not None and not shared[0].done():
            records, more = await asyncio.shield(shared[1])
            return list(records), more
        events = self.store.events
        stale = events.subscribe(conversation_id)  # done once an append could be missed
        reading = asyncio.ensure_future(
            self.store.read_page(conversation_id, after, limit, max_bytes)
        )
        reading.add_done_callback(_retrieve)  # its error is seen even if every asker left
        self.reads += 1
        self._inflight[key] = (stale, reading)
        try:
            records, more = await asyncio.shield(reading)
            return list(records), more
        finally:
            if self._inflight.get(key, (None, None))[1] is reading:
                del self._inflight[key]
            events.unsubscribe(conversation_id, stale)


def _retrieve(done: asyncio.Future[Page]) -> None:
    if not done.cancelled():
        done.exception()
