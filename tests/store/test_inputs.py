"""The store contract for inputs from outside: channel deliveries and schedule cursors."""

from __future__ import annotations

import asyncio

import pytest

from hearth.store import NewSubmission, Store
from hearth.store.rows import NewDelivery

pytestmark = pytest.mark.anyio


def delivery(delivery_id: str = "d-1", channel: str = "hooks", at: float = 100.0) -> NewDelivery:
    return NewDelivery(
        channel=channel,
        delivery_id=delivery_id,
        type="push",
        data={"n": 1},
        body='{"n": 1}',
        headers={"x-event": "push"},
        received_at=at,
    )


def routed(delivery_id: str, *conversations: str) -> list[NewSubmission]:
    return [
        NewSubmission(
            conversation_id=conv,
            agent=conv.split("/")[0],
            kind="channel",
            payload={"message": f"to {conv}"},
            idempotency_key=f"channel:hooks:{delivery_id}:{i}",
            source={"channel": "hooks", "delivery_id": delivery_id},
        )
        for i, conv in enumerate(conversations)
    ]


def occurrence(name: str, at: float, conv: str = "support/daily") -> NewSubmission:
    return NewSubmission(
        conversation_id=conv,
        agent="support",
        kind="scheduled",
        payload={"message": "tick", "scheduled_for": at},
        idempotency_key=f"schedule:{name}:{at}",
        source={"schedule": name, "occurrence": at},
    )


async def test_a_delivery_admits_all_its_submissions_with_their_source(store: Store) -> None:
    first = await store.admit_delivery(delivery(), routed("d-1", "support/a", "billing/b"))
    assert not first.deduplicated
    assert first.delivery.status == "admitted" and first.delivery.attempts == 1
    subs = [await store.get_submission(sid) for sid in first.delivery.submission_ids]
    assert [s.conversation_id for s in subs if s] == ["support/a", "billing/b"]
    assert all(s and s.kind == "channel" for s in subs)
    assert all(s and s.source == {"channel": "hooks", "delivery_id": "d-1"} for s in subs)


async def test_a_redelivery_writes_nothing_and_answers_the_first_result(store: Store) -> None:
    first = await store.admit_delivery(delivery(), routed("d-1", "support/a"))
    # Routing that changed since cannot admit twice: the row is checked, not the keys.
    again = await store.admit_delivery(delivery(), routed("d-1", "support/other", "support/b"))
    assert again.deduplicated
    assert again.delivery.submission_ids == first.delivery.submission_ids
    assert await store.get_conversation("support/other") is None
    assert len(await store.list_submissions()) == 1


async def test_a_failed_delivery_is_kept_and_admitted_when_routed_again(store: Store) -> None:
    failed = await store.fail_delivery(delivery(), {"type": "KeyError", "message": "x"})
    assert (failed.status, failed.attempts, failed.submission_ids) == ("failed", 1, [])
    assert failed.error == {"type": "KeyError", "message": "x"}
    assert failed.body == '{"n": 1}' and failed.headers == {"x-event": "push"}
    assert await store.list_submissions() == []
    done = await store.admit_delivery(delivery(), routed("d-1", "support/a"))
    assert not done.deduplicated
    assert (done.delivery.status, done.delivery.attempts, done.delivery.error) == (
        "admitted",
        2,
        None,
    )


async def test_a_delivery_routed_again_shows_what_its_latest_routing_was_given(
    store: Store,
) -> None:
    """Sent again under its id with another body (the sender fixed what failed), the row shows
    the body that was admitted, not the one that failed; its first arrival stays."""
    await store.fail_delivery(delivery(), {"type": "KeyError", "message": "x"})
    fixed = NewDelivery(
        channel="hooks",
        delivery_id="d-1",
        type="push.v2",
        data={"n": 2},
        body='{"n": 2}',
        headers={"x-event": "push.v2"},
        received_at=200.0,
    )
    done = (await store.admit_delivery(fixed, routed("d-1", "support/a"))).delivery
    assert (done.type, done.data, done.body, done.headers) == (
        "push.v2",
        {"n": 2},
        '{"n": 2}',
        {"x-event": "push.v2"},
    )
    assert done.received_at == 100.0
    listed = await store.list_deliveries("hooks")
    assert [(d.delivery_id, d.body) for d in listed] == [("d-1", '{"n": 2}')]


async def test_failing_an_admitted_delivery_leaves_it_admitted(store: Store) -> None:
    first = await store.admit_delivery(delivery(), routed("d-1", "support/a"))
    kept = await store.fail_delivery(delivery(), {"type": "late", "message": "x"})
    assert kept.status == "admitted"
    assert kept.submission_ids == first.delivery.submission_ids


async def test_deliveries_are_listed_newest_first_and_by_status(store: Store) -> None:
    await store.admit_delivery(delivery("d-1", at=1.0), [])
    await store.fail_delivery(delivery("d-2", at=2.0), {"type": "E", "message": ""})
    await store.admit_delivery(delivery("d-3", at=3.0), [])
    await store.admit_delivery(delivery("x-1", channel="other"), [])
    listed = await store.list_deliveries("hooks")
    assert [d.delivery_id for d in listed] == ["d-3", "d-2", "d-1"]
    failed = await store.list_deliveries("hooks", status="failed")
    assert [d.delivery_id for d in failed] == ["d-2"]
    assert await store.get_delivery("hooks", "nope") is None


async def test_one_delivery_admitted_from_two_handles_at_once_is_admitted_once(
    store_pair: tuple[Store, Store],
) -> None:
    a, b = store_pair
    for n in range(5):
        did = f"d-{n}"
        results = await asyncio.gather(
            a.admit_delivery(delivery(did), routed(did, "support/a", "support/b")),
            b.admit_delivery(delivery(did), routed(did, "support/b", "support/a")),
        )
        assert sorted(r.deduplicated for r in results) == [False, True]
        assert results[0].delivery.submission_ids == results[1].delivery.submission_ids
    assert len(await a.list_submissions()) == 10


async def test_a_new_schedule_starts_at_now_and_keeps_its_cursor(store: Store) -> None:
    opened = await store.open_schedule("daily", "0 9 * * *|UTC", 500.0)
    assert (opened.cursor, opened.last_occurrence) == (500.0, None)
    again = await store.open_schedule("daily", "0 9 * * *|UTC", 900.0)
    assert again.cursor == 500.0


async def test_a_changed_schedule_starts_from_now(store: Store) -> None:
    await store.open_schedule("daily", "0 9 * * *|UTC", 500.0)
    assert await store.admit_occurrence("daily", "0 9 * * *|UTC", 500.0, 600.0, occurrence("d", 1))
    changed = await store.open_schedule("daily", "0 10 * * *|UTC", 900.0)
    assert (changed.spec, changed.cursor, changed.last_occurrence) == (
        "0 10 * * *|UTC",
        900.0,
        600.0,
    )


async def test_an_occurrence_moves_the_cursor_by_compare_and_set(store: Store) -> None:
    spec = "* * * * *|UTC"
    await store.open_schedule("tick", spec, 500.0)
    admitted = await store.admit_occurrence("tick", spec, 500.0, 540.0, occurrence("tick", 540))
    assert admitted is not None and admitted.submission.kind == "scheduled"
    assert admitted.submission.source == {"schedule": "tick", "occurrence": 540}
    # A process that read the old cursor loses, and writes nothing.
    assert await store.admit_occurrence("tick", spec, 500.0, 540.0, occurrence("tick", 540)) is None
    assert await store.admit_occurrence("tick", spec, 500.0, 600.0, occurrence("tick", 600)) is None
    # So does one whose spec is no longer the schedule's.
    assert await store.admit_occurrence("tick", "x", 540.0, 600.0, occurrence("tick", 600)) is None
    [cursor] = await store.list_schedules()
    assert (cursor.cursor, cursor.last_occurrence) == (540.0, 540.0)
    assert len(await store.list_submissions()) == 1


async def test_two_handles_racing_for_one_occurrence_admit_it_once(
    store_pair: tuple[Store, Store],
) -> None:
    a, b = store_pair
    spec = "* * * * *|UTC"
    await a.open_schedule("tick", spec, 0.0)
    cursor = 0.0
    for n in range(1, 11):
        at = 60.0 * n
        results = await asyncio.gather(
            a.admit_occurrence("tick", spec, cursor, at, occurrence("tick", at)),
            b.admit_occurrence("tick", spec, cursor, at, occurrence("tick", at)),
        )
        assert sum(r is not None for r in results) == 1
        cursor = at
    assert len(await a.list_submissions()) == 10
