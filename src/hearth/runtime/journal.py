"""The one place an attempt writes through: fenced appends, crash points, and a local copy of
the records this attempt has seen."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from hearth import _faults
from hearth.jsontext import storable_text
from hearth.records import Compaction, Record, as_stored
from hearth.runtime.model_context import first_needed_offset
from hearth.store.base import Fence, Store
from hearth.store.rules import settlement


class Journal:
    """Appends for one attempt of one submission, fenced by its claim."""

    def __init__(
        self,
        store: Store,
        conversation_id: str,
        fence: Fence,
        observe: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.store = store
        self.conversation_id = conversation_id
        self.fence = fence
        self.observe = observe  # told how long each append took (the append histogram)
        self.records: list[Record] = []  # what this attempt has read, in stream order

    @property
    def last_offset(self) -> int:
        return self.records[-1].offset if self.records else -1

    async def load_for(self, submission_id: str) -> None:
        """Read what a loop of ``submission_id`` needs: from the latest compaction's cut on, and
        the records it keeps from before the cut. A compaction of the submission's own loop
        keeps its input, so everything of the submission is read (its evidence); an earlier
        submission's kept records are read one by one, so a long loop of the past is not read
        again."""
        compaction = await self.store.last_of_type(self.conversation_id, Compaction.type)
        if not isinstance(compaction, Compaction):
            await self.load(-1)
        elif compaction.submission_id == submission_id:
            await self.load(first_needed_offset(compaction) - 1)
        else:
            kept = compaction.kept_offsets or ()
            await self.load(compaction.first_kept_offset - 1, also=kept)

    async def load(self, after: int, also: Sequence[int] = ()) -> None:
        """Read the records after ``after``, preceded by those at the offsets ``also`` (records
        a compaction keeps from before its cut)."""
        head: list[Record] = []
        for offset in sorted(o for o in also if o <= after):
            head += await self.store.read(self.conversation_id, after=offset - 1, limit=1)
        self.records = head + await self.store.read(self.conversation_id, after=after)

    async def refresh(self) -> None:
        """Pick up records appended since the last read (by this attempt or anyone else)."""
        self.take(await self.store.read(self.conversation_id, after=self.last_offset))

    def take(self, new: Sequence[Record]) -> None:
        """Add records read after this journal's last offset (a concurrent append of this
        attempt may have landed meanwhile: only those past it are new)."""
        last = self.last_offset
        self.records.extend(r for r in new if r.offset > last)

    def stamp(self, records: Sequence[Record]) -> list[Record]:
        return [r.stamped(self.fence.submission_id, self.fence.attempt) for r in records]

    async def append(self, *records: Record) -> list[int]:
        stamped = self.stamp(records)
        for r in stamped:
            _faults.reached(f"before:{r.type}")
        _faults.reached("before:store.append")
        t0 = time.perf_counter()
        offsets = await self.store.append(self.conversation_id, stamped, fence=self.fence)
        self.observe(time.perf_counter() - t0)
        _faults.reached("after:store.append")
        for r in stamped:
            _faults.reached(f"after:{r.type}")
        first = self.last_offset + 1
        if list(offsets) == list(range(first, first + len(offsets))):
            # Nothing else was appended in between: keep the local copy current without a read,
            # as the store keeps it (a model's or a tool's half surrogate pair made the next
            # request in the same attempt fail to encode, while a recovery read U+FFFD).
            self.records += [
                as_stored(r.with_offset(o)) for r, o in zip(stamped, offsets, strict=True)
            ]
        else:
            await self.refresh()
        return offsets

    async def transact(
        self,
        work: Callable[[Any], Awaitable[Any]],
        records: Callable[[Any], Sequence[Record]],
        ids: Sequence[str],
    ) -> list[Record]:
        """``Store.transact``, fenced by this attempt: the application's ``work`` and the
        records made from its value commit in one transaction."""

        def stamped(value: Any) -> list[Record]:
            return self.stamp(records(value))

        _faults.reached("before:store.transact")
        t0 = time.perf_counter()
        stored = await self.store.transact(self.conversation_id, self.fence, work, stamped, ids=ids)
        self.observe(time.perf_counter() - t0)
        _faults.reached("after:store.transact")
        for r in stored:
            _faults.reached(f"after:{r.type}")
        await self.refresh()
        return stored

    async def settle(
        self,
        *,
        outcome: str,
        reply: str | None,
        error: dict[str, Any] | None,
        records_before: Sequence[Record] = (),
    ) -> int:
        """Write the settlement (after ``records_before``) exactly once, fenced."""
        sid = self.fence.submission_id
        if reply is not None:
            reply = storable_text(reply)  # a text column keeps it, as the record does
        record = settlement(sid, outcome, error, reply).stamped(sid, self.fence.attempt)
        before = self.stamp(records_before)
        for r in [*before, record]:
            _faults.reached(f"before:{r.type}")
        _faults.reached("before:store.settle")
        t0 = time.perf_counter()
        offset = await self.store.settle(
            self.fence, record, outcome=outcome, error=error, reply=reply, records_before=before
        )
        self.observe(time.perf_counter() - t0)
        _faults.reached("after:store.settle")
        for r in [*before, record]:
            _faults.reached(f"after:{r.type}")
        return offset
