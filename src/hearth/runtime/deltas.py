"""The delta writer: an assistant message's partial text, persisted in batches while it streams."""

from __future__ import annotations

import asyncio
import time

from hearth import _faults
from hearth.records import AssistantTextDelta
from hearth.runtime.journal import Journal

FLUSH_INTERVAL_S = 0.05
FLUSH_CHUNKS = 64


class DeltaWriter:
    """Buffers text deltas of one assistant message and appends them in batches: at once when
    the last write is older than 50 ms, otherwise 50 ms after it, or as soon as 64 chunks wait."""

    def __init__(self, journal: Journal, message_id: str) -> None:
        self.journal = journal
        self.message_id = message_id
        self.text: list[str] = []
        self._pending: list[str] = []
        self._seq = 0
        self._last_flush = 0.0
        self._timer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._failure: BaseException | None = None

    async def add(self, delta: str) -> None:
        if self._failure is not None:
            raise self._failure
        self.text.append(delta)
        self._pending.append(delta)
        since = time.monotonic() - self._last_flush
        if len(self._pending) >= FLUSH_CHUNKS or (
            since >= FLUSH_INTERVAL_S and self._timer is None
        ):
            await self.flush()
        elif self._timer is None:
            self._timer = asyncio.create_task(self._flush_later(FLUSH_INTERVAL_S - since))

    async def _flush_later(self, delay: float) -> None:
        await asyncio.sleep(max(delay, 0.0))
        self._timer = None
        try:
            await self.flush()
        except Exception as exc:  # surfaced by the next add() or close()
            self._failure = exc

    async def flush(self) -> None:
        async with self._lock:
            if not self._pending:
                return
            chunk, self._pending = "".join(self._pending), []
            seq, self._seq = self._seq, self._seq + 1
            self._last_flush = time.monotonic()
            _faults.reached("delta:flush")
            await self.journal.append(
                AssistantTextDelta(
                    id=f"{self.message_id}:d{seq}", message_id=self.message_id, seq=seq, delta=chunk
                )
            )

    async def close(self) -> None:
        """Flush what is left; after this, the message can be completed."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            try:
                await timer
            except asyncio.CancelledError:
                pass
        if self._failure is not None:
            raise self._failure
        await self.flush()

    def abandon(self) -> None:
        """Stop the pending timer without writing (the attempt is being torn down)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
