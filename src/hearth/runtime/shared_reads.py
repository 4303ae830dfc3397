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

_Key = tuple[str, int, int | None]


class SharedReads:
    """Single-flight reads of a conversation's stream, keyed by (conversation, after, limit)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0  # store reads issued: what a counting test observes
        self._inflight: dict[_Key, tuple[asyncio.Future[int], asyncio.Future[list[Record]]]] = {}

    async def read(self, conversation_id: str, after: int, limit: int | None) -> list[Record]:
        key = (conversation_id, after, limit)
        shared = self._inflight.get(key)
        if shared is not None and not shared[0].done():
            return list(await asyncio.shield(shared[1]))
        events = self.store.events
        stale = events.subscribe(conversation_id)  # done once an append could be missed
        reading = asyncio.ensure_future(self.store.read(conversation_id, after, limit))
        reading.add_done_callback(_retrieve)  # its error is seen even if every asker left
        self.reads += 1
        self._inflight[key] = (stale, reading)
        try:
            return list(await asyncio.shield(reading))
        finally:
            if self._inflight.get(key, (None, None))[1] is reading:
                del self._inflight[key]
            events.unsubscribe(conversation_id, stale)


def _retrieve(done: asyncio.Future[list[Record]]) -> None:
    if not done.cancelled():
        done.exception()
