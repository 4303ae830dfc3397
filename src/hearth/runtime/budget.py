"""The spending budget (``Durability(max_tokens=N)``): the model tokens one submission has spent,
counted from its records, so that no crash, restart or retry can reset the count.

Every model call made for a submission leaves its usage in a record stamped with the
submission's id: its turns (``assistant_message_completed.usage``), its compaction summaries
(``compaction.usage``), and the turns of its delegated tasks' children, whose records carry the
parent's claim. ``Spending`` sums them incrementally as the attempt reads records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hearth.records import AssistantMessageCompleted, ChildConversationLinked, Compaction, Record
from hearth.runtime.journal import Journal
from hearth.store.base import Store


def usage_tokens(usage: dict[str, Any] | None) -> int:
    """The tokens a provider's usage report counts: input plus output."""
    if not usage:
        return 0
    total = 0
    for key in ("input_tokens", "output_tokens"):
        value = usage.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            total += int(value)
    return total


def record_tokens(record: Record) -> int:
    if isinstance(record, AssistantMessageCompleted | Compaction):
        return usage_tokens(record.usage)
    return 0


class Spending:
    """The tokens one submission spent, across its conversation (read through the attempt's
    ``journal``) and its children's (read from the store). One per attempt, shared by the
    loops of its delegated tasks, so a child's turns see the whole submission's count."""

    def __init__(self, store: Store, submission_id: str, journal: Journal) -> None:
        self.store = store
        self.submission_id = submission_id
        self.journal = journal
        self.total = 0
        self._counted = 0  # how many of the attempt's records are counted
        self._children: dict[str, int] = {}  # child conversation → last offset counted
        # The children of one batch run at once and count at their turn boundaries: two counts
        # reading a child's new records at once each added them (a budget spent twice as fast).
        self._counting = asyncio.Lock()

    def _add(self, records: Sequence[Record]) -> None:
        for r in records:
            if r.submission_id != self.submission_id:
                continue
            self.total += record_tokens(r)
            if isinstance(r, ChildConversationLinked):
                self._children.setdefault(r.child_conversation_id, -1)

    async def count(self) -> int:
        """The total so far."""
        async with self._counting:
            records = self.journal.records  # grows as the attempt reads and appends
            self._add(records[self._counted :])
            self._counted = len(records)
            read: set[str] = set()
            while todo := [c for c in self._children if c not in read]:  # grandchildren too
                for child in todo:
                    read.add(child)
                    after = self._children[child]
                    while new := await self.store.read(child, after=after, limit=1000):
                        self._add(new)
                        after = self._children[child] = new[-1].offset
            return self.total
