"""Fenced appends of many conversations at once share statements on PostgreSQL, and each still
succeeds or fails alone: a stale attempt in the group is fenced out, the others land."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hearth.errors import FencedOut
from hearth.records import UserMessage
from hearth.store import NewSubmission
from hearth.store.rows import Fence

pytestmark = pytest.mark.anyio

CONVERSATIONS = 40


def msg(n: int, submission_id: str, conversation: int = 0) -> UserMessage:
    return UserMessage(
        id=f"m{conversation}-{n}", message_id=f"m{n}", content="x", submission_id=submission_id
    )


async def running_in(store: Any, count: int) -> list[Fence]:
    fences = []
    for i in range(count):
        await store.admit(NewSubmission(f"support/c{i}", "support", "message", {"m": 1}))
    claimed = await store.claim("owner-1", 30.0, count)
    by_conversation = {sub.conversation_id: sub.fence for sub in claimed}
    for i in range(count):
        fences.append(by_conversation[f"support/c{i}"])
    return fences


async def test_concurrent_steps_of_many_conversations_share_statements(pg_store: Any) -> None:
    fences = await running_in(pg_store, CONVERSATIONS)
    for i, fence in enumerate(fences):  # the first append of each learns its offset
        await pg_store.append(f"support/c{i}", [msg(1, fence.submission_id, i)], fence=fence)
    before = pg_store._group.statements

    async def steps(i: int, fence: Fence) -> list[list[int]]:
        return [
            await pg_store.append(f"support/c{i}", [msg(n, fence.submission_id, i)], fence=fence)
            for n in range(2, 12)
        ]

    results = await asyncio.gather(*(steps(i, f) for i, f in enumerate(fences)))
    assert results == [[[n] for n in range(2, 12)]] * CONVERSATIONS
    statements = pg_store._group.statements - before
    assert statements < CONVERSATIONS * 10 / 4, statements  # not one per step
    for i in range(CONVERSATIONS):
        records = await pg_store.read(f"support/c{i}")
        assert [r.offset for r in records] == list(range(12))
        assert [r.id for r in records[1:]] == [f"m{i}-{n}" for n in range(1, 12)]


async def test_a_stale_attempt_in_a_group_is_fenced_out_and_the_others_land(
    pg_store: Any,
) -> None:
    fences = await running_in(pg_store, CONVERSATIONS)
    for i, fence in enumerate(fences):
        await pg_store.append(f"support/c{i}", [msg(1, fence.submission_id, i)], fence=fence)
    stale = Fence(fences[7].submission_id, fences[7].attempt - 1)  # as a zombie would hold

    async def step(i: int) -> Any:
        fence = stale if i == 7 else fences[i]
        records = [msg(2, fence.submission_id, i), msg(3, fence.submission_id, i)]
        return await pg_store.append(f"support/c{i}", records, fence=fence)

    results = await asyncio.gather(*(step(i) for i in range(CONVERSATIONS)), return_exceptions=True)
    assert isinstance(results[7], FencedOut)
    assert [r for i, r in enumerate(results) if i != 7] == [[2, 3]] * (CONVERSATIONS - 1)
    assert [r.offset for r in await pg_store.read("support/c7")] == [0, 1]
    assert [r.offset for r in await pg_store.read("support/c8")] == [0, 1, 2, 3]


async def test_a_group_whose_statement_fails_sends_each_append_the_general_way(
    pg_store: Any,
) -> None:
    """A record id that exists already fails the whole statement; every append of the group
    then goes the general way, which writes the others and reads the existing one back."""
    fences = await running_in(pg_store, 8)
    for i, fence in enumerate(fences):
        await pg_store.append(f"support/c{i}", [msg(1, fence.submission_id, i)], fence=fence)
    clash = msg(1, fences[3].submission_id, 3)  # the id c3 already holds, at a new offset

    async def step(i: int) -> Any:
        records = [clash] if i == 3 else [msg(2, fences[i].submission_id, i)]
        return await pg_store.append(f"support/c{i}", records, fence=fences[i])

    results = await asyncio.gather(*(step(i) for i in range(8)), return_exceptions=True)
    assert [r for i, r in enumerate(results) if i != 3] == [[2]] * 7
    assert results[3] == [1]  # the id is stored already: read back, not written twice
    for i in range(8):
        ids = [r.id for r in await pg_store.read(f"support/c{i}")][1:]
        assert ids == ([f"m{i}-1"] if i == 3 else [f"m{i}-1", f"m{i}-2"])


async def test_a_one_statement_join_writes_nothing_unless_fence_row_and_offset_all_hold(
    pg_store: Any,
) -> None:
    """Once the host has appended, a join is tried as one statement. A stale host, or a row that
    is not queued there, leaves everything as it was; the general path then answers as it always
    did. (A moved offset: ``test_statement_counts``.)"""

    conv, other = "support/c0", "support/c1"
    [host] = await running_in(pg_store, 1)
    assert await pg_store.append(conv, [msg(1, host.submission_id)], fence=host) == [1]
    elsewhere = (await pg_store.admit(NewSubmission(other, "support", "message", {}))).submission
    guest = (await pg_store.admit(NewSubmission(conv, "support", "message", {}))).submission

    async def stream() -> list[tuple[int, str]]:
        return [(r.offset, r.id) for r in await pg_store.read(conv)]

    before = await stream()
    # Of another conversation, or not there at all: not joined, nothing written.
    assert not await pg_store.join(host, elsewhere.id, [msg(2, elsewhere.id)])
    assert not await pg_store.join(host, "s_missing", [msg(3, "s_missing")])
    assert await stream() == before
    # A stale fence (an attempt that is not the running one) is fenced out, nothing written.
    stale = Fence(host.submission_id, host.attempt + 1)
    with pytest.raises(FencedOut):
        await pg_store.join(stale, guest.id, [msg(4, guest.id)])
    assert await stream() == before
    row = await pg_store.get_submission(guest.id)
    assert row is not None and row.status == "queued"
    # The real host joins it, in one statement, and the next step follows at once.
    assert await pg_store.join(host, guest.id, [msg(5, guest.id)])
    assert not await pg_store.join(host, guest.id, [msg(6, guest.id)])  # joined already
    assert await pg_store.append(conv, [msg(7, host.submission_id)], fence=host) == [3]
    assert (await stream())[len(before) :] == [(2, "m0-5"), (3, "m0-7")]
    row = await pg_store.get_submission(guest.id)
    assert row is not None and (row.status, row.joined_to) == ("joined", host.submission_id)
