"""The store contract for durable waits (SPEC §15): every store implementation passes these."""

from __future__ import annotations

import asyncio

import pytest
from test_conformance import CONV, admitted, ids, new, running

from hearth.errors import AbortRequested, FencedOut, StoreError, WaitConflict, WaitNotFound
from hearth.records import WaitResolved, WaitStarted, iso_from_unix
from hearth.store import Store, Submission
from hearth.testing.clock import ManualClock

pytestmark = pytest.mark.anyio


def started(
    sub: Submission, name: str = "approval", expires_at: float | None = None
) -> tuple[str, WaitStarted]:
    record = WaitStarted(
        id=f"m1:wait:call-1:{name}",
        submission_id=sub.id,
        attempt=sub.attempt,
        wait_id=f"w_{name}",
        tool_call_id="call-1",
        name=name,
        prompt=f"{name}?",
        expires_at=None if expires_at is None else iso_from_unix(expires_at),
    )
    return CONV, record


async def waiting(store: Store, *names: str, expires_at: float | None = None) -> Submission:
    sub = await running(store)
    await store.begin_wait(sub.fence, [started(sub, n, expires_at) for n in names or ("approval",)])
    row = await store.get_submission(sub.id)
    assert row is not None
    return row


def resolved(records: list[object]) -> list[WaitResolved]:
    return [r for r in records if isinstance(r, WaitResolved)]


async def test_begin_wait_appends_the_record_and_leaves_the_submission_waiting_unleased(
    store: Store,
) -> None:
    sub = await waiting(store)
    assert (sub.status, sub.lease_owner, sub.lease_expires_at, sub.waits) == (
        "waiting",
        None,
        None,
        1,
    )
    assert sub.waiting_since is not None
    assert (await ids(store))[-1] == "m1:wait:call-1:approval"
    [wait] = await store.list_waits()
    assert (wait.wait_id, wait.submission_id, wait.name, wait.prompt, wait.state) == (
        "w_approval",
        sub.id,
        "approval",
        "approval?",
        "pending",
    )
    assert await store.get_wait(CONV, "w_approval") == wait
    assert await store.claim("owner-2", 30.0, 10) == []  # a waiting submission is not runnable
    assert await store.renew_all("owner-1", 30.0) == []


async def test_begin_wait_from_a_stale_attempt_is_fenced_out_and_writes_nothing(
    store: Store, clock: ManualClock
) -> None:
    stale = await running(store)
    clock.advance(31)
    [fresh] = await store.claim("owner-2", 30.0, 10)
    before = await ids(store)
    with pytest.raises(FencedOut):
        await store.begin_wait(stale.fence, [started(stale)])
    assert await ids(store) == before and await store.list_waits() == []
    row = await store.get_submission(fresh.id)
    assert row is not None and row.status == "running"


async def test_begin_wait_under_an_abort_intent_is_refused_and_writes_nothing(
    store: Store,
) -> None:
    sub = await running(store)
    before = await ids(store)
    assert await store.request_abort(CONV) == [sub.id]
    with pytest.raises(AbortRequested):
        await store.begin_wait(sub.fence, [started(sub)])
    assert await ids(store) == before and await store.list_waits() == []
    row = await store.get_submission(sub.id)
    assert row is not None and (row.status, row.waits) == ("running", 0)


async def test_begin_wait_with_no_wait_pending_is_refused(store: Store) -> None:
    sub = await running(store)
    with pytest.raises(StoreError):
        await store.begin_wait(sub.fence, [])
    row = await store.get_submission(sub.id)
    assert row is not None and row.status == "running"


async def test_begin_wait_keeps_the_carried_writes_for_the_attempt_that_resumes(
    store: Store,
) -> None:
    sub = await running(store)
    carried = {
        CONV: {"message_id": "m1", "attempt": sub.attempt, "writes": {"n": 1, "note": "é"}},
        "support/c-child": {"message_id": "m7", "attempt": sub.attempt, "writes": {"x": None}},
    }
    await store.begin_wait(sub.fence, [started(sub)], carried)
    row = await store.get_submission(sub.id)
    assert row is not None and row.carried == carried
    await store.resolve_wait(CONV, "w_approval", True)
    [again] = await store.claim("owner-2", 30.0, 10)
    assert again.carried == carried
    # The next pause keeps what it carries; one that carries nothing clears the row's.
    await store.begin_wait(again.fence, [started(again, "second")])
    row = await store.get_submission(sub.id)
    assert row is not None and row.carried is None


async def test_resolve_records_the_value_once_and_queues_the_submission_again(
    store: Store, clock: ManualClock
) -> None:
    sub = await waiting(store)
    clock.advance(500)  # waiting does not count toward the deadline
    wait = await store.resolve_wait(CONV, "w_approval", {"ok": True})
    assert (wait.state, wait.value) == ("resolved", {"ok": True})
    [record] = resolved(await store.read(CONV))
    assert (record.id, record.wait_id, record.value, record.timed_out) == (
        "w_approval:resolved",
        "w_approval",
        {"ok": True},
        False,
    )
    row = await store.get_submission(sub.id)
    assert row is not None and (row.status, row.waiting_since) == ("queued", None)
    assert sub.deadline is not None and row.deadline == sub.deadline + 500
    [again] = await store.claim("owner-2", 30.0, 10)
    assert (again.id, again.attempt, again.waits, again.interruptions) == (sub.id, 2, 1, 1)
    assert await store.list_waits() == []


async def test_an_identical_resolve_writes_nothing_and_another_value_conflicts(
    store: Store,
) -> None:
    await waiting(store)
    await store.resolve_wait(CONV, "w_approval", [1, {"a": 2}])
    after = await ids(store)
    again = await store.resolve_wait(CONV, "w_approval", [1, {"a": 2}])
    assert again.value == [1, {"a": 2}] and await ids(store) == after
    with pytest.raises(WaitConflict):
        await store.resolve_wait(CONV, "w_approval", [1, {"a": 3}])
    with pytest.raises(WaitNotFound):
        await store.resolve_wait(CONV, "w_other", True)
    with pytest.raises(WaitNotFound):
        await store.resolve_wait("support/c-9", "w_approval", True)


async def test_a_submission_with_two_waits_is_queued_once_both_ended(store: Store) -> None:
    sub = await waiting(store, "first", "second")
    await store.resolve_wait(CONV, "w_first", 1)
    row = await store.get_submission(sub.id)
    assert row is not None and row.status == "waiting"
    assert [w.name for w in await store.list_waits()] == ["second"]
    await store.resolve_wait(CONV, "w_second", 2)
    row = await store.get_submission(sub.id)
    assert row is not None and row.status == "queued"


async def test_expire_waits_ends_the_due_waits_as_timed_out(
    store: Store, clock: ManualClock
) -> None:
    now = clock()
    sub = await waiting(store, expires_at=now + 10)
    other = await running(store, "support/c-2")
    record = started(other, "later", now + 100)[1]
    await store.begin_wait(other.fence, [("support/c-2", record)])
    assert await store.next_wait_expiry() == pytest.approx(now + 10, abs=0.01)
    assert await store.expire_waits() == []
    clock.advance(11)
    [ended] = await store.expire_waits()
    assert ended.wait_id == "w_approval"
    [record] = resolved(await store.read(CONV))
    assert record.timed_out and record.value is None
    row = await store.get_submission(sub.id)
    assert row is not None and row.status == "queued"
    assert await store.next_wait_expiry() == pytest.approx(now + 100, abs=0.01)
    with pytest.raises(WaitConflict):
        await store.resolve_wait(CONV, "w_approval", True)


async def test_a_wait_past_its_timeout_cannot_be_resolved_before_an_expiry_pass_ends_it(
    store: Store, clock: ManualClock
) -> None:
    """While no process ran its expiry pass (all of them down, say), a resolve after the
    timeout was taken, and the tool got the value instead of ``WaitTimedOut``."""
    sub = await waiting(store, expires_at=clock() + 10)
    clock.advance(11)
    with pytest.raises(WaitConflict, match="timed out"):
        await store.resolve_wait(CONV, "w_approval", True)
    assert resolved(await store.read(CONV)) == []  # nothing written
    [ended] = await store.expire_waits()
    assert ended.wait_id == "w_approval"
    [record] = resolved(await store.read(CONV))
    assert record.timed_out
    row = await store.get_submission(sub.id)
    assert row is not None and row.status == "queued"


async def test_an_abort_ends_the_waits_and_queues_the_submission_to_settle_aborted(
    store: Store,
) -> None:
    sub = await waiting(store)
    assert await store.request_abort(CONV) == [sub.id]
    [record] = resolved(await store.read(CONV))
    assert record.aborted
    row = await store.get_submission(sub.id)
    assert row is not None and row.status == "queued" and row.abort_requested_at is not None
    with pytest.raises(WaitConflict):
        await store.resolve_wait(CONV, "w_approval", True)
    [claimed] = await store.claim("owner-2", 30.0, 10)
    assert claimed.id == sub.id


async def test_a_message_admitted_while_one_waits_queues_behind_it(store: Store) -> None:
    sub = await waiting(store)
    later = (await store.admit(new(CONV, "later"))).submission
    assert await store.claim("owner-2", 30.0, 10) == []
    await store.resolve_wait(CONV, "w_approval", True)
    [claimed] = await store.claim("owner-2", 30.0, 10)
    assert claimed.id == sub.id and later.status == "queued"


async def test_racing_resolves_with_different_values_have_one_winner(
    store_pair: tuple[Store, Store],
) -> None:
    one, two = store_pair
    await waiting(one)
    results = await asyncio.gather(
        one.resolve_wait(CONV, "w_approval", "yes"),
        two.resolve_wait(CONV, "w_approval", "no"),
        return_exceptions=True,
    )
    conflicts = [r for r in results if isinstance(r, WaitConflict)]
    assert len(conflicts) == 1
    assert len(resolved(await one.read(CONV))) == 1


async def test_a_resolve_racing_an_abort_has_one_result(store_pair: tuple[Store, Store]) -> None:
    one, two = store_pair
    sub = await waiting(one)
    outcome = await asyncio.gather(
        one.resolve_wait(CONV, "w_approval", "yes"), two.request_abort(CONV), return_exceptions=True
    )
    [record] = resolved(await one.read(CONV))
    if isinstance(outcome[0], WaitConflict):
        assert record.aborted  # the abort came first
    else:
        assert record.value == "yes" and not record.aborted  # the resolve came first
    row = await one.get_submission(sub.id)
    assert row is not None and row.status == "queued" and row.abort_requested_at is not None


async def test_list_waits_filters_by_conversation_and_pages(store: Store) -> None:
    await waiting(store, "a", "b", "c")
    other = await admitted(store, "support/c-2")
    assert other.status == "queued"
    first = await store.list_waits(limit=2)
    assert [w.name for w in first] == ["a", "b"]
    assert [w.name for w in await store.list_waits(after=first[-1].seq)] == ["c"]
    assert await store.list_waits("support/c-2") == []
    assert len(await store.list_waits(CONV)) == 3
