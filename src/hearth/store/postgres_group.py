"""Group commit on the client: fenced appends of different conversations, written together.

Each fast append (``postgres_ops.fast_append``) is one statement and one commit. With many
conversations stepping at once, a process's pool (``HEARTH_PG_POOL``, 10 by default) then bounds
how many commits are in flight, and each waits for its own. Here an append joins the appends
waiting while the previous statement runs; the next statement writes them all, each under its
own fence and its own expected offset, in one transaction and one commit.

Each append in a group succeeds or fails alone: one whose fence no longer holds, or whose
conversation moved, is left out and its caller takes the general path, as it would after a
failed fast append. A statement that fails as a whole (a record id exists, a lost connection,
a deadlock) fails every append in it the same way; the general path reads back what is stored
and writes only what is missing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from hearth.records import Record
from hearth.store.postgres_ops import NOW
from hearth.store.rows import Fence

FLUSHERS = 2  # statements in flight at once: one fills while the other runs
MAX_GROUP = 256  # appends in one statement

GROUP_APPEND = f"""
WITH items AS (
    SELECT * FROM unnest(%(ix)b::int[], %(sid)b::text[], %(attempt)b::int[], %(c)b::text[],
                         %(expect)b::bigint[], %(last)b::bigint[])
        AS i(ix, sid, attempt, c, expect, last)),
fence AS (
    SELECT i.ix FROM items i
    JOIN submissions s ON s.id = i.sid AND s.status = 'running' AND s.attempt = i.attempt
    FOR SHARE OF s),
moved AS (
    UPDATE conversations cv SET last_offset = i.last, last_activity = {NOW}
    FROM items i
    WHERE cv.conversation_id = i.c AND cv.last_offset = i.expect
      AND i.ix IN (SELECT ix FROM fence)
    RETURNING i.ix),
added AS (
    INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)
    SELECT r.c, r.o, r.id, r.t, r.s, r.b, r.d
    FROM unnest(%(rix)b::int[], %(rc)b::text[], %(os)b::bigint[], %(ids)b::text[],
                %(ts)b::text[], %(ss)b::text[], %(bs)b::text[], %(ds)b::text[])
        AS r(ix, c, o, id, t, s, b, d)
    WHERE r.ix IN (SELECT ix FROM moved)
    RETURNING 1)
SELECT ix, (SELECT count(*) FROM added) AS added FROM moved
"""


@dataclass
class GroupItem:
    """One fenced append: ``records`` after offset ``expect`` of ``conversation_id``."""

    conversation_id: str
    records: list[Record]
    expect: int
    fence: Fence
    done: asyncio.Future[bool] = field(repr=False)


def group_append(items: list[GroupItem], now: float | None) -> tuple[str, dict[str, Any]]:
    """The statement writing ``items`` (each under its own fence) and its parameters."""
    params: dict[str, Any] = {
        "now": now,
        "ix": [],
        "sid": [],
        "attempt": [],
        "c": [],
        "expect": [],
        "last": [],
        "rix": [],
        "rc": [],
        "os": [],
        "ids": [],
        "ts": [],
        "ss": [],
        "bs": [],
        "ds": [],
    }
    # In the order of their conversations, as a group of admissions locks them: the update
    # takes the rows in this order, so the two never wait for each other in a cycle.
    for ix, item in sorted(enumerate(items), key=lambda pair: pair[1].conversation_id):
        params["ix"].append(ix)
        params["sid"].append(item.fence.submission_id)
        params["attempt"].append(item.fence.attempt)
        params["c"].append(item.conversation_id)
        params["expect"].append(item.expect)
        params["last"].append(item.expect + len(item.records))
        for i, record in enumerate(item.records):
            offset = item.expect + 1 + i
            body, digest = record.encode(offset)
            params["rix"].append(ix)
            params["rc"].append(item.conversation_id)
            params["os"].append(offset)
            params["ids"].append(record.id)
            params["ts"].append(record.type)
            params["ss"].append(record.submission_id)
            params["bs"].append(body)
            params["ds"].append(digest)
    return GROUP_APPEND, params


class Waiting(Protocol):
    """What ``Grouped`` needs of an item: its conversation, and the future its caller awaits."""

    conversation_id: str
    done: asyncio.Future[Any]


ItemT = TypeVar("ItemT", bound=Waiting)
AnswerT = TypeVar("AnswerT")


class Grouped(Generic[ItemT, AnswerT]):
    """Items waiting for a statement, and the tasks that write them.

    ``run(items)`` writes one group and returns each item's answer, in order; an exception from
    it is every item's. At most ``flushers`` groups are written at once; an item arriving
    meanwhile waits for the next group (group commit, as the SQLite writer thread does). A group
    holds one item per conversation, the oldest waiting first, and none of a conversation that a
    group being written holds: two statements in flight never wait for each other's row locks.
    """

    def __init__(
        self,
        run: Callable[[list[ItemT]], Awaitable[Sequence[AnswerT]]],
        *,
        flushers: int = FLUSHERS,
        max_group: int = MAX_GROUP,
    ):
        self.run = run
        self.flushers = flushers
        self.max_group = max_group
        self.statements = 0  # groups written: what a test counts
        self._pending: list[ItemT] = []
        self._writing: set[str] = set()  # the conversations of the groups being written
        self._busy = 0  # groups being written now
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: ItemT, *, until: float | None = None) -> AnswerT:
        """``item``'s answer, once the group it joined is written. With ``until`` (a
        ``time.monotonic()``): ``TimeoutError`` if by then no group has taken the item (it is
        dropped, never written); one that took it is waited for, as its writer is bounded."""
        if self._busy == 0 and not self._pending:
            # Nothing else is being written: write it here, with no hand-off to another task.
            self._busy += 1
            self.statements += 1
            self._writing.add(item.conversation_id)
            try:
                [answer] = await self.run([item])
                return answer
            finally:
                self._writing.discard(item.conversation_id)
                self._busy -= 1
                self._start()  # for what queued up meanwhile
        self._pending.append(item)
        self._start()
        if until is None:
            return cast(AnswerT, await item.done)
        # (a timer, not a timeout around the wait: that needed the wait shielded, so as not to
        # cancel an answer a writer was about to give, which cost a turn of the loop)
        timer = asyncio.get_running_loop().call_at(_loop_time(until), self._expire, item)
        try:
            return cast(AnswerT, await item.done)
        except asyncio.CancelledError:
            item.done.cancel()  # its caller is gone: a group not written yet drops it
            raise
        finally:
            timer.cancel()

    def _expire(self, item: ItemT) -> None:
        """``item``'s time is up: if no group has taken it, it is dropped, never written, and its
        caller gets ``TimeoutError``; one that took it is waited for (its writer is bounded)."""
        if item in self._pending:
            self._pending.remove(item)
            if not item.done.done():
                item.done.set_exception(TimeoutError())

    def _start(self) -> None:
        if self._pending and self._busy < self.flushers:
            self._busy += 1
            task = asyncio.ensure_future(self._flush())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[ItemT]:
        """The next group: the oldest waiting items, one per conversation."""
        group: list[ItemT] = []
        seen: set[str] = set()
        rest: list[ItemT] = []
        for item in self._pending:
            if item.done.done():
                continue  # its caller was cancelled before it was written: drop it
            busy = item.conversation_id in seen or item.conversation_id in self._writing
            if busy or len(group) >= self.max_group:
                rest.append(item)
            else:
                seen.add(item.conversation_id)
                group.append(item)
        self._pending = rest
        return group

    async def _flush(self) -> None:
        try:
            await self._drain()
        finally:
            self._busy -= 1

    async def _drain(self) -> None:
        while self._pending:
            group = self._take()
            if not group:
                # What waits belongs to the group being written: that writer takes it next.
                return
            self.statements += 1
            held = {item.conversation_id for item in group}
            self._writing |= held
            try:
                answers = await self.run(group)
            except Exception as exc:
                for item in group:
                    if not item.done.done():
                        item.done.set_exception(exc)
                continue
            except BaseException:  # cancelled (the store is closing): so are its items
                for item in [*group, *self._pending]:
                    item.done.cancel()
                raise
            finally:
                self._writing -= held
            for item, answer in zip(group, answers, strict=True):
                if not item.done.done():
                    item.done.set_result(answer)


Run = Callable[[list[GroupItem]], Awaitable[set[int]]]


class GroupAppends(Grouped[GroupItem, bool]):
    """Fast appends of different conversations, written together: ``run(items)`` writes one
    group and returns the indexes of the items it wrote (the others take the general path)."""

    def __init__(self, run: Run, *, flushers: int = FLUSHERS, max_group: int = MAX_GROUP):
        async def judged(items: list[GroupItem]) -> list[bool]:
            written = await run(items)
            return [ix in written for ix in range(len(items))]

        super().__init__(judged, flushers=flushers, max_group=max_group)

    async def append(
        self, conversation_id: str, records: list[Record], expect: int, fence: Fence
    ) -> bool:
        """Whether the records were written at ``expect + 1`` on (False: take the general path)."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        return await self.submit(GroupItem(conversation_id, records, expect, fence, done))


def _loop_time(monotonic: float) -> float:
    """``monotonic`` (a ``time.monotonic()``) as the running loop's clock reads it."""
    return asyncio.get_running_loop().time() + (monotonic - time.monotonic())
