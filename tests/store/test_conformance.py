"""The store contract: every store implementation passes these tests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hearth.errors import FencedOut, IdempotencyConflict, IntegrityError, StoreError
from hearth.records import (
    AssistantMessageStarted,
    ConversationCreated,
    Record,
    Signal,
    StateWrite,
    SubmissionSettled,
    UserMessage,
)
from hearth.store import Event, Fence, Held, NewSubmission, Store, Submission, rules
from hearth.store.base import TurnView
from hearth.testing.clock import ManualClock

pytestmark = pytest.mark.anyio

CONV = "support/c-1"
OTHER = "support/c-2"


def new(
    conversation_id: str = CONV, text: str = "hi", key: str | None = None, **extra: Any
) -> NewSubmission:
    return NewSubmission(
        conversation_id=conversation_id,
        agent=conversation_id.split("/", 1)[0],
        kind="message",
        payload={"text": text},
        idempotency_key=key,
        **extra,
    )


async def admitted(store: Store, conversation_id: str = CONV, text: str = "hi") -> Submission:
    return (await store.admit(new(conversation_id, text))).submission


async def running(store: Store, conversation_id: str = CONV, owner: str = "owner-1") -> Submission:
    sub = await admitted(store, conversation_id)
    claimed = await store.claim(owner, 30.0, 100)
    return next(c for c in claimed if c.id == sub.id)


def msg(n: int, submission_id: str | None = None, content: str | None = None) -> UserMessage:
    text = f"text {n}" if content is None else content
    return UserMessage(id=f"m{n}", message_id=f"m{n}", content=text, submission_id=submission_id)


def settlement(sub: Submission, outcome: str = "completed", reply: str | None = "done") -> Record:
    return SubmissionSettled(
        id=f"{sub.id}:settled", submission_id=sub.id, outcome=outcome, reply=reply
    )


async def last_offset(store: Store, conversation_id: str) -> int:
    info = await store.get_conversation(conversation_id)
    return -1 if info is None else info.last_offset


async def ids(store: Store, conversation_id: str = CONV) -> list[str]:
    return [r.id for r in await store.read(conversation_id)]


# --- the stream ------------------------------------------------------------------------------


async def test_offsets_are_dense_across_batches(store: Store) -> None:
    await admitted(store)
    first = await store.append(CONV, [msg(1), msg(2)])
    second = await store.append(CONV, [msg(3)])
    third = await store.append(CONV, [msg(4), msg(5), msg(6)])
    assert (first, second, third) == ([1, 2], [3], [4, 5, 6])
    assert [r.offset for r in await store.read(CONV)] == list(range(7))
    assert await last_offset(store, CONV) == 6


async def test_offsets_are_counted_per_conversation(store: Store) -> None:
    await admitted(store, CONV)
    await admitted(store, OTHER)
    assert await store.append(CONV, [msg(1)]) == [1]
    assert await store.append(OTHER, [msg(1)]) == [1]


async def test_records_are_stored_with_their_offset_and_content(store: Store) -> None:
    await admitted(store)
    record = UserMessage(id="m1", message_id="m1", content=[{"type": "text", "text": "héllo"}])
    [offset] = await store.append(CONV, [record])
    [stored] = await store.read(CONV, after=0)
    assert stored == record.with_offset(offset)


async def test_a_batch_is_atomic_when_its_last_record_conflicts(store: Store) -> None:
    await admitted(store)
    await store.append(CONV, [msg(1)])
    with pytest.raises(IntegrityError):
        await store.append(CONV, [msg(2), msg(3), msg(1, content="something else")])
    assert await ids(store) == [f"{CONV}:created", "m1"]
    assert await last_offset(store, CONV) == 1
    assert await store.append(CONV, [msg(2)]) == [2]


async def test_reappending_the_same_record_returns_its_original_offset(store: Store) -> None:
    await admitted(store)
    [offset] = await store.append(CONV, [msg(1)])
    await store.append(CONV, [msg(2)])
    again = UserMessage(
        id="m1", message_id="m1", content="text 1", attempt=7, at="2030-01-01T00:00:00.000Z"
    )
    assert await store.append(CONV, [again]) == [offset]
    assert await ids(store) == [f"{CONV}:created", "m1", "m2"]


async def test_text_without_a_utf8_form_is_stored_with_replacement_characters(
    store: Store,
) -> None:
    """Half a surrogate pair (a tool's or a model's cut emoji) has no UTF-8 form: the record is
    stored with U+FFFD in its place, and the same record appended again, as it was made or as it
    was read back, is the same fact at the same offset."""
    await admitted(store)
    made = msg(1, content="cut \ud83d here \udc00")
    [offset] = await store.append(CONV, [made])
    [stored] = await store.read(CONV, after=offset - 1)
    assert isinstance(stored, UserMessage) and stored.content == "cut \ufffd here \ufffd"
    assert await store.append(CONV, [made]) == [offset]
    assert await store.append(CONV, [stored]) == [offset]
    assert await last_offset(store, CONV) == offset


async def test_reappending_an_id_with_other_content_is_an_integrity_error(store: Store) -> None:
    await admitted(store)
    await store.append(CONV, [msg(1)])
    with pytest.raises(IntegrityError):
        await store.append(CONV, [msg(1, content="changed")])
    assert await last_offset(store, CONV) == 1


async def test_a_batch_mixing_known_and_new_records_appends_only_the_new(store: Store) -> None:
    await admitted(store)
    await store.append(CONV, [msg(1), msg(2)])
    assert await store.append(CONV, [msg(1), msg(3), msg(2), msg(4)]) == [1, 3, 2, 4]
    assert await ids(store) == [f"{CONV}:created", "m1", "m2", "m3", "m4"]


async def test_a_record_repeated_within_one_batch_is_written_once(store: Store) -> None:
    await admitted(store)
    assert await store.append(CONV, [msg(1), msg(1)]) == [1, 1]
    with pytest.raises(IntegrityError):
        await store.append(CONV, [msg(2), msg(2, content="other")])
    assert await last_offset(store, CONV) == 1


async def test_record_ids_are_unique_per_conversation_only(store: Store) -> None:
    await admitted(store, CONV)
    await admitted(store, OTHER)
    await store.append(CONV, [msg(1)])
    assert await store.append(OTHER, [msg(1, content="different here")]) == [1]


async def test_appending_to_an_unknown_conversation_is_an_error(store: Store) -> None:
    with pytest.raises(StoreError):
        await store.append("support/nobody", [msg(1)])
    assert await store.get_conversation("support/nobody") is None


async def test_an_append_starting_with_conversation_created_creates_a_child(store: Store) -> None:
    parent = await running(store)
    child = "researcher/c-1.t1"
    created = ConversationCreated(
        id=f"{child}:created",
        agent="researcher",
        conversation_id=child,
        parent={"conversation_id": CONV, "tool_call_id": "t1"},
    )
    assert await store.append(child, [created, msg(1)], fence=parent.fence) == [0, 1]
    info = await store.get_conversation(child)
    assert info is not None
    assert (info.agent, info.last_offset, info.parent) == ("researcher", 1, created.parent)


async def test_read_returns_records_after_an_offset(store: Store) -> None:
    await admitted(store)
    await store.append(CONV, [msg(n) for n in range(1, 6)])
    assert [r.offset for r in await store.read(CONV, after=3)] == [4, 5]
    assert await store.read(CONV, after=5) == []
    assert [r.offset for r in await store.read(CONV)] == [0, 1, 2, 3, 4, 5]


async def test_a_page_ends_at_its_limit_or_after_the_record_that_reaches_its_byte_budget(
    store: Store,
) -> None:
    await admitted(store)  # offset 0: a small record
    big = "x" * 100_000
    await store.append(CONV, [msg(n, content=big) for n in range(1, 6)])  # 1..5: ~100 kB each
    assert [r.offset for r in (await store.read_page(CONV, -1, 2, 10**9))[0]] == [0, 1]
    assert (await store.read_page(CONV, -1, 2, 10**9))[1] is True
    records, more = await store.read_page(CONV, 0, 100, 250_000)
    assert [r.offset for r in records] == [1, 2, 3] and more  # the third reaches 250 kB
    assert records[0] == (await store.read(CONV, after=0, limit=1))[0]
    records, more = await store.read_page(CONV, 3, 100, 1)  # one record, however large
    assert [r.offset for r in records] == [4] and more
    records, more = await store.read_page(CONV, 3, 2, 10**9)  # exactly what is left
    assert [r.offset for r in records] == [4, 5] and not more
    records, more = await store.read_page(CONV, 4, 100, 100_000)
    assert [r.offset for r in records] == [5] and not more
    assert await store.read_page(CONV, 5, 100, 1) == ([], False)
    assert await store.read_page("support/nothing", -1, 100, 1) == ([], False)


async def test_read_respects_the_limit(store: Store) -> None:
    await admitted(store)
    await store.append(CONV, [msg(n) for n in range(1, 6)])
    assert [r.offset for r in await store.read(CONV, after=1, limit=2)] == [2, 3]
    assert [r.offset for r in await store.read(CONV, limit=0)] == []


async def test_an_unknown_conversation_reads_empty(store: Store) -> None:
    assert await store.read("support/nobody") == []
    assert await last_offset(store, "support/nobody") == -1


async def test_last_of_type_returns_the_latest_record_of_that_type(store: Store) -> None:
    await admitted(store)
    first = Signal(id="sig1", signal_type="stream_interrupted")
    second = Signal(id="sig2", signal_type="submission_aborted")
    await store.append(CONV, [first, msg(1), second, msg(2)])
    found = await store.last_of_type(CONV, "signal")
    assert found == second.with_offset(3)
    assert await store.last_of_type(CONV, "compaction") is None


# --- state -----------------------------------------------------------------------------------


async def test_state_write_records_update_the_state(store: Store) -> None:
    await admitted(store)
    await store.append(CONV, [StateWrite(id="w1", name="count", value=1)])
    await store.append(
        CONV,
        [
            StateWrite(id="w2", name="count", value=2),
            StateWrite(id="w3", name="seen", value={"a": [1, None]}),
        ],
    )
    assert await store.get_state(CONV) == {"count": 2, "seen": {"a": [1, None]}}


async def test_a_rejected_batch_leaves_the_state_unchanged(store: Store) -> None:
    await admitted(store)
    await store.append(CONV, [msg(1), StateWrite(id="w1", name="count", value=1)])
    with pytest.raises(IntegrityError):
        await store.append(
            CONV, [StateWrite(id="w2", name="count", value=2), msg(1, content="changed")]
        )
    assert await store.get_state(CONV) == {"count": 1}


async def test_reappending_an_old_state_write_does_not_revert_the_state(store: Store) -> None:
    await admitted(store)
    old = StateWrite(id="w1", name="count", value=1)
    await store.append(CONV, [old])
    await store.append(CONV, [StateWrite(id="w2", name="count", value=2)])
    await store.append(CONV, [old])
    assert await store.get_state(CONV) == {"count": 2}


# --- fencing ---------------------------------------------------------------------------------


async def test_a_fenced_append_from_the_current_attempt_is_accepted(store: Store) -> None:
    sub = await running(store)
    assert await store.append(CONV, [msg(1, sub.id)], fence=sub.fence) == [1]


async def test_a_fenced_append_from_a_stale_attempt_is_rejected(
    store: Store, clock: ManualClock
) -> None:
    clock.set(1000.0)
    sub = await running(store)
    clock.set(2000.0)
    again = await store.claim("owner-2", 30.0, 1)
    assert [s.attempt for s in again] == [2]
    with pytest.raises(FencedOut):
        await store.append(CONV, [msg(1, sub.id)], fence=sub.fence)
    assert await last_offset(store, CONV) == 0


async def test_a_fenced_append_to_a_queued_submission_is_rejected(store: Store) -> None:
    sub = await admitted(store)
    with pytest.raises(FencedOut):
        await store.append(CONV, [msg(1, sub.id)], fence=Fence(sub.id, 0))
    assert await last_offset(store, CONV) == 0


async def test_a_fenced_append_to_a_settled_submission_is_rejected(store: Store) -> None:
    sub = await running(store)
    await store.settle(sub.fence, settlement(sub), outcome="completed", error=None, reply="ok")
    with pytest.raises(FencedOut):
        await store.append(CONV, [msg(1, sub.id)], fence=sub.fence)
    assert await ids(store) == [f"{CONV}:created", f"{sub.id}:settled"]


async def test_a_fenced_append_for_an_unknown_submission_is_rejected(store: Store) -> None:
    await admitted(store)
    with pytest.raises(FencedOut):
        await store.append(CONV, [msg(1)], fence=Fence("s_missing", 1))


async def test_a_fenced_reappend_is_rejected_too(store: Store) -> None:
    sub = await running(store)
    await store.append(CONV, [msg(1, sub.id)], fence=sub.fence)
    await store.settle(sub.fence, settlement(sub), outcome="completed", error=None, reply=None)
    with pytest.raises(FencedOut):
        await store.append(CONV, [msg(1, sub.id)], fence=sub.fence)


# --- admission -------------------------------------------------------------------------------


async def test_admission_creates_the_conversation_with_conversation_created_at_0(
    store: Store,
) -> None:
    admission = await store.admit(new())
    [created] = await store.read(CONV)
    assert isinstance(created, ConversationCreated)
    assert (created.offset, created.id) == (0, f"{CONV}:created")
    assert (created.agent, created.conversation_id, created.parent) == ("support", CONV, None)
    assert admission.offset == 0
    assert not admission.deduplicated
    info = await store.get_conversation(CONV)
    assert info is not None
    assert (info.conversation_id, info.agent, info.last_offset) == (CONV, "support", 0)


async def test_admission_writes_a_queued_submission_row(store: Store) -> None:
    admission = await store.admit(new(max_attempts=3, timeout=60.0))
    sub = admission.submission
    assert sub.status == "queued"
    assert (sub.attempt, sub.max_attempts, sub.timeout) == (0, 3, 60.0)
    assert (sub.kind, sub.payload, sub.conversation_id) == ("message", {"text": "hi"}, CONV)
    assert sub.deadline is None and sub.started_at is None and sub.lease_owner is None
    assert sub.accepted_at > 0
    assert await store.get_submission(sub.id) == sub


async def test_a_later_admission_reuses_the_conversation(store: Store) -> None:
    await store.admit(new())
    await store.append(CONV, [msg(1)])
    second = await store.admit(new(text="again"))
    assert second.offset == 1
    assert await ids(store) == [f"{CONV}:created", "m1"]


async def test_an_admission_to_an_existing_conversation_keeps_every_value_as_given(
    store: Store,
) -> None:
    await admitted(store)  # the conversation exists: later admissions take the quick path
    text = "quotes ' \" \\ back; semi-colon -- dash %(c)s %s\nline 2\tüñí €𝄞 ''"
    cases = [
        new(text=text, key=f"k'{text[:12]}", max_attempts=3, timeout=12.5),
        new(
            text="x",
            source={"channel": "hook's", "delivery": "d\\1"},
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
    ]
    for made in cases:
        admission = await store.admit(made)
        row = await store.get_submission(admission.submission.id)
        assert row is not None
        assert row == admission.submission
        assert (row.payload, row.idempotency_key, row.max_attempts, row.timeout) == (
            made.payload,
            made.idempotency_key,
            made.max_attempts,
            made.timeout,
        )
        assert (row.source, row.traceparent) == (made.source, made.traceparent)
        assert (row.status, row.attempt, row.conversation_id) == ("queued", 0, CONV)
    again = await store.admit(cases[0])
    assert again.deduplicated


async def test_a_turn_view_reads_new_records_the_state_and_the_row_together(
    store: Store,
) -> None:
    sub = await running(store)
    await store.append(CONV, [msg(1, sub.id), StateWrite(id="w1", name="count", value=1)])
    view = await store.turn_view(CONV, 1, sub.id)
    assert [(r.offset, r.id) for r in view.records] == [(2, "w1")]
    assert view.records == await store.read(CONV, after=1)
    assert view.state == {"count": 1} == await store.get_state(CONV)
    assert view.submission == await store.get_submission(sub.id)
    await store.request_abort(CONV)
    later = await store.turn_view(CONV, 2, sub.id)
    assert later.records == []
    assert later.submission is not None and later.submission.abort_requested_at is not None
    assert (await store.turn_view(OTHER, -1, "s_missing")) == TurnView([], {}, None)


async def test_get_submissions_reads_those_that_exist_in_admission_order(store: Store) -> None:
    first, second, third = [await admitted(store, c) for c in (CONV, OTHER, CONV)]
    found = await store.get_submissions([third.id, "s_missing", first.id, third.id])
    assert [s.id for s in found] == [first.id, third.id]
    assert found[0] == await store.get_submission(first.id)
    assert await store.get_submissions([]) == []
    many = await store.get_submissions([second.id] + [f"s_{i}" for i in range(1200)])
    assert [s.id for s in many] == [second.id]


async def test_the_same_idempotency_key_and_payload_return_the_first_submission(
    store: Store,
) -> None:
    first = await store.admit(new(key="k1"))
    await store.append(CONV, [msg(1)])
    again = await store.admit(new(key="k1"))
    assert again.deduplicated and again.submission == first.submission
    assert again.offset == first.offset == 0  # the first receipt, unchanged
    assert len(await store.list_submissions(CONV)) == 1


async def test_the_traceparent_of_the_admission_is_kept_through_claims(store: Store) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    first = (await store.admit(new(key="k1", traceparent=parent))).submission
    plain = (await store.admit(new(OTHER))).submission
    assert first.traceparent == parent and plain.traceparent is None
    claimed = {s.id: s for s in await store.claim("owner-1", 30.0, 10)}
    assert claimed[first.id].traceparent == parent  # what a recovery attempt continues
    assert claimed[plain.id].traceparent is None
    other = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    again = await store.admit(new(key="k1", traceparent=other))
    assert again.deduplicated and again.submission.traceparent == parent  # the first trace


async def test_deduplication_holds_after_settlement(store: Store) -> None:
    first = await store.admit(new(key="k1"))
    [sub] = await store.claim("owner-1", 30.0, 1)
    await store.settle(sub.fence, settlement(sub), outcome="completed", error=None, reply="hi")
    again = await store.admit(new(key="k1"))
    assert again.deduplicated
    assert again.submission.id == first.submission.id
    assert (again.submission.status, again.submission.reply) == ("settled", "hi")


async def test_the_same_idempotency_key_with_another_payload_conflicts(store: Store) -> None:
    await store.admit(new(key="k1"))
    with pytest.raises(IdempotencyConflict):
        await store.admit(new(text="other", key="k1"))
    assert len(await store.list_submissions(CONV)) == 1


async def test_idempotency_keys_are_scoped_to_the_conversation(store: Store) -> None:
    first = await store.admit(new(CONV, key="k1"))
    other = await store.admit(new(OTHER, key="k1"))
    assert not other.deduplicated
    assert other.submission.id != first.submission.id


async def test_list_submissions_filters_by_conversation_and_status(store: Store) -> None:
    a1 = await admitted(store, CONV)
    b1 = await admitted(store, OTHER)
    a2 = await admitted(store, CONV)
    await store.claim("owner-1", 30.0, 1)
    assert [s.id for s in await store.list_submissions()] == [a1.id, b1.id, a2.id]
    assert [s.id for s in await store.list_submissions(CONV)] == [a1.id, a2.id]
    assert [s.id for s in await store.list_submissions(statuses=["queued"])] == [b1.id, a2.id]
    assert [s.id for s in await store.list_submissions(CONV, ["running"])] == [a1.id]


async def test_list_submissions_pages_with_a_cursor(store: Store) -> None:
    made = [await admitted(store, CONV if n % 2 else OTHER, f"m{n}") for n in range(5)]
    first = await store.list_submissions(limit=2)
    assert [s.id for s in first] == [m.id for m in made[:2]]
    rest = await store.list_submissions(after=first[-1].seq, limit=10)
    assert [s.id for s in rest] == [m.id for m in made[2:]]
    mine = await store.list_submissions(CONV, after=made[1].seq, limit=10)
    assert [s.id for s in mine] == [made[3].id]
    assert await store.list_submissions(limit=0) == []


async def test_list_submissions_pages_from_the_newest_back(store: Store) -> None:
    """``before``: the newest submissions before a ``seq``, newest first (a snapshot reads
    what it shows from the newest back, not every submission from the first)."""
    made = [await admitted(store, CONV if n % 2 else OTHER, f"m{n}") for n in range(5)]
    newest = await store.list_submissions(before=2**62, limit=2)
    assert [s.id for s in newest] == [made[4].id, made[3].id]
    older = await store.list_submissions(before=newest[-1].seq, limit=10)
    assert [s.id for s in older] == [m.id for m in reversed(made[:3])]
    mine = await store.list_submissions(CONV, before=2**62, limit=10)
    assert [s.id for s in mine] == [made[3].id, made[1].id]


async def test_submissions_are_counted_and_the_latest_settled_read_from_the_newest(
    store: Store,
) -> None:
    for n in range(3):  # settled, one after another, in CONV
        sub = await running(store, CONV)
        outcome = "failed" if n == 1 else "completed"
        await store.settle(
            sub.fence, settlement(sub, outcome), outcome=outcome, error=None, reply=""
        )
    other = await running(store, OTHER)
    queued = await admitted(store, OTHER)
    assert await store.count_submissions() == {
        ("settled", "completed"): 2,
        ("settled", "failed"): 1,
        ("running", None): 1,
        ("queued", None): 1,
    }
    assert await store.count_submissions(OTHER) == {("running", None): 1, ("queued", None): 1}
    assert await store.count_submissions("support/nothing") == {}
    latest = await store.latest_settled(2)
    every = await store.list_submissions(CONV)
    assert [s.id for s in latest] == [every[2].id, every[1].id]  # newest first
    assert latest[0].outcome == "completed" and latest[1].outcome == "failed"
    assert await store.latest_settled(10, OTHER) == []
    assert [s.id for s in await store.latest_settled(10, CONV)] == [s.id for s in every[::-1]]
    assert other.id != queued.id and await store.latest_settled(0) == []


# --- the conversation list ------------------------------------------------------------------


async def test_conversations_are_listed_newest_activity_first(
    store: Store, clock: ManualClock
) -> None:
    clock.set(100.0)
    await admitted(store, CONV)
    clock.set(200.0)
    await admitted(store, OTHER)
    clock.set(300.0)
    await store.append(CONV, [msg(1)])  # an append is activity
    listed = await store.list_conversations()
    assert [(c.conversation_id, c.agent, c.last_activity) for c in listed] == [
        (CONV, "support", 300.0),
        (OTHER, "support", 200.0),
    ]
    assert [c.last_offset for c in listed] == [1, 0]


async def test_the_conversation_list_counts_unsettled_submissions_and_filters_by_status(
    store: Store,
) -> None:
    await admitted(store, CONV)
    await admitted(store, CONV)
    done = await running(store, OTHER)
    await store.settle(done.fence, settlement(done), outcome="completed", error=None, reply="ok")
    counts = {c.conversation_id: c.unsettled for c in await store.list_conversations()}
    assert counts == {CONV: 2, OTHER: 0}
    assert [c.conversation_id for c in await store.list_conversations(status="active")] == [CONV]
    assert [c.conversation_id for c in await store.list_conversations(status="idle")] == [OTHER]
    with pytest.raises(ValueError, match="status"):
        await store.list_conversations(status="settled")


async def test_active_conversations_older_than_the_window_are_listed_and_paged(
    store: Store, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of active conversations looks through the newest few first (``ACTIVE_WINDOW``);
    one it does not fill is read from the open submissions: old active ones behind many newer
    idle ones are found, in order, page after page (walking every row took 110 ms at 100,000)."""
    monkeypatch.setattr(rules, "ACTIVE_WINDOW", 4)
    for n in range(12):
        clock.set(100.0 + 20 * n)  # each in its own activity bucket
        sub = await running(store, f"support/c-{n:02}")
        if n % 5 != 0:  # c-00, c-05 and c-10 stay active
            record = settlement(sub)
            await store.settle(sub.fence, record, outcome="completed", error=None, reply="ok")
    first = await store.list_conversations(status="active", limit=2)
    assert [c.conversation_id for c in first] == ["support/c-10", "support/c-05"]
    assert [c.unsettled for c in first] == [1, 1]
    rest = await store.list_conversations(
        status="active", limit=2, before=(first[-1].last_activity, first[-1].conversation_id)
    )
    assert [c.conversation_id for c in rest] == ["support/c-00"]
    newest = await store.list_conversations("support", status="active", limit=1)
    assert [c.conversation_id for c in newest] == ["support/c-10"]
    idle = await store.list_conversations(status="idle", limit=3)
    assert [c.conversation_id for c in idle] == ["support/c-11", "support/c-09", "support/c-08"]


async def test_the_conversation_list_filters_by_agent(store: Store) -> None:
    await admitted(store, CONV)
    await admitted(store, "billing/c-1")
    await admitted(store, OTHER)
    assert [c.conversation_id for c in await store.list_conversations("support")] == [OTHER, CONV]
    assert [c.conversation_id for c in await store.list_conversations("billing")] == ["billing/c-1"]
    assert await store.list_conversations("nobody") == []


async def test_the_conversation_list_pages_with_a_cursor_through_equal_times(
    store: Store, clock: ManualClock
) -> None:
    made = []
    for n in range(7):
        clock.set(100.0 + n // 3)  # three conversations share each instant
        made.append((await admitted(store, f"support/c-{n}")).conversation_id)
    expected = [c.conversation_id for c in await store.list_conversations(limit=100)]
    assert sorted(expected) == sorted(made) and expected[0] == "support/c-6"
    seen: list[str] = []
    before = None
    while True:
        page = await store.list_conversations("support", before=before, limit=2)
        seen += [c.conversation_id for c in page]
        if len(page) < 2:
            break
        before = page[-1].cursor
    assert seen == expected  # each once, in order, across pages
    assert await store.list_conversations(limit=0) == []


async def test_the_conversation_list_keeps_exact_order_across_activity_buckets(
    store: Store, clock: ManualClock
) -> None:
    """The list's index holds activity to the 10 seconds; the order and the pages are still
    exact to the last digit, across bucket edges and after an append moves a conversation."""
    times = {"c-0": 9.999, "c-1": 19.5, "c-2": 10.0, "c-3": 10.0, "c-4": 20.0, "c-5": 5.0}
    for name, at in times.items():
        clock.set(at)
        await admitted(store, f"support/{name}")
    clock.set(20.0)
    await store.append("support/c-5", [msg(1)])  # from the first bucket to the third
    clock.set(1e9 + 0.25)
    await admitted(store, "support/c-6")
    times |= {"c-5": 20.0, "c-6": 1e9 + 0.25}
    expected = [
        f"support/{name}" for name, _ in sorted(times.items(), key=lambda t: (t[1], t[0]))[::-1]
    ]
    for agent in (None, "support"):
        listed = await store.list_conversations(agent)
        assert [(c.conversation_id, c.last_activity) for c in listed] == [
            (c, times[c.removeprefix("support/")]) for c in expected
        ]
        seen: list[str] = []
        before = None
        while page := await store.list_conversations(agent, before=before, limit=2):
            seen += [c.conversation_id for c in page]
            before = page[-1].cursor
        assert seen == expected


# --- claims and leases -----------------------------------------------------------------------


async def test_claim_takes_the_oldest_submission_of_a_conversation(
    store: Store, clock: ManualClock
) -> None:
    first = await admitted(store, CONV, "one")
    await admitted(store, CONV, "two")
    clock.set(1000.0)
    [claimed] = await store.claim("owner-1", 30.0, 10)
    assert claimed.id == first.id
    assert (claimed.status, claimed.attempt, claimed.lease_owner) == ("running", 1, "owner-1")
    assert (claimed.lease_expires_at, claimed.started_at) == (1030.0, 1000.0)
    assert claimed.deadline == 1000.0 + claimed.timeout
    assert await store.get_submission(first.id) == claimed


async def test_claim_takes_at_most_one_per_conversation_oldest_first(store: Store) -> None:
    a1 = await admitted(store, CONV)
    b1 = await admitted(store, OTHER)
    await admitted(store, CONV)
    claimed = await store.claim("owner-1", 30.0, 10)
    assert [c.id for c in claimed] == [a1.id, b1.id]


async def test_claim_respects_the_limit(store: Store) -> None:
    subs = [await admitted(store, f"support/c-{n}") for n in range(5)]
    claimed = await store.claim("owner-1", 30.0, 2)
    assert [c.id for c in claimed] == [subs[0].id, subs[1].id]


async def test_claim_skips_a_conversation_with_a_running_submission(store: Store) -> None:
    await running(store, CONV)
    await admitted(store, CONV)
    assert await store.claim("owner-2", 30.0, 10) == []


async def test_claim_takes_the_next_submission_once_the_first_settles(store: Store) -> None:
    first = await running(store, CONV)
    second = await admitted(store, CONV)
    await store.settle(first.fence, settlement(first), outcome="completed", error=None, reply="")
    assert [c.id for c in await store.claim("owner-1", 30.0, 10)] == [second.id]


async def test_after_a_host_settles_the_next_queued_message_past_its_joined_ones_is_claimed(
    store: Store,
) -> None:
    host = await running(store, CONV)
    guest = await admitted(store, CONV)
    later = await admitted(store, CONV)
    assert await store.join(host.fence, guest.id, [msg(1, guest.id)])
    assert await store.claim("owner-2", 30.0, 10) == []  # nothing behind a running host
    await store.settle(host.fence, settlement(host), outcome="completed", error=None, reply="")
    assert [c.id for c in await store.claim("owner-2", 30.0, 10)] == [later.id]


async def test_many_waiting_messages_of_busy_conversations_leave_others_claimable(
    store: Store,
) -> None:
    busy = [await running(store, f"support/busy-{n}") for n in range(3)]
    for n in range(30):
        await admitted(store, f"support/busy-{n % 3}")
    idle = await admitted(store, "support/idle")
    assert [c.id for c in await store.claim("owner-2", 30.0, 10)] == [idle.id]
    await store.settle(
        busy[1].fence, settlement(busy[1]), outcome="completed", error=None, reply=""
    )
    [next_one] = await store.claim("owner-2", 30.0, 10)
    assert next_one.conversation_id == "support/busy-1"


async def test_claim_skips_excluded_conversations(store: Store) -> None:
    await admitted(store, CONV)
    b1 = await admitted(store, OTHER)
    claimed = await store.claim("owner-1", 30.0, 10, exclude_conversations=[CONV])
    assert [c.id for c in claimed] == [b1.id]


async def test_claim_leaves_other_agents_work_to_those_declaring_them_for_a_while(
    store: Store, clock: ManualClock
) -> None:
    """During a rolling redeploy a process of the older release claimed the new agent's
    submissions and settled them ``agent_missing`` (9 of 20 in one run), though a process of
    the newer release that declares it was running."""
    clock.set(1000.0)
    ours = await admitted(store, CONV)
    new_agent = await admitted(store, "billing/c-1")
    old_release = ["support"]
    claimed = await store.claim("old", 3600.0, 10, agents=old_release, others_after=300.0)
    assert [c.id for c in claimed] == [ours.id]
    clock.set(1299.0)
    assert await store.claim("old", 3600.0, 10, agents=old_release, others_after=300.0) == []
    clock.set(1300.0)  # nobody took it: the agent may have been removed, settle it
    [late] = await store.claim("old", 3600.0, 10, agents=old_release, others_after=300.0)
    assert late.id == new_agent.id


async def test_claim_with_the_agents_declared_takes_their_work_at_once(
    store: Store, clock: ManualClock
) -> None:
    clock.set(1000.0)
    await admitted(store, CONV)
    await admitted(store, "billing/c-1")
    both = await store.claim("new", 30.0, 10, agents=["support", "billing"], others_after=300.0)
    assert sorted(c.conversation_id for c in both) == ["billing/c-1", CONV]


async def test_claim_leaves_a_live_lease_alone(store: Store, clock: ManualClock) -> None:
    clock.set(1000.0)
    await running(store)
    clock.set(1029.0)
    assert await store.claim("owner-2", 30.0, 10) == []


async def test_claim_reclaims_an_expired_lease_with_the_next_attempt(
    store: Store, clock: ManualClock
) -> None:
    clock.set(1000.0)
    sub = await running(store)
    clock.set(1030.0)
    [again] = await store.claim("owner-2", 30.0, 10)
    assert again.id == sub.id
    assert (again.attempt, again.lease_owner, again.lease_expires_at) == (2, "owner-2", 1060.0)


async def test_the_deadline_is_set_by_the_first_claim_only(
    store: Store, clock: ManualClock
) -> None:
    clock.set(1000.0)
    sub = await running(store)
    clock.set(5000.0)
    [again] = await store.claim("owner-2", 30.0, 10)
    assert again.deadline == sub.deadline == 1000.0 + sub.timeout
    assert again.started_at == 1000.0


async def test_joined_submissions_are_never_claimed(store: Store) -> None:
    host = await running(store)
    guest = await admitted(store)
    assert await store.join(host.fence, guest.id, [msg(1, guest.id)])
    await store.release(host.fence, "owner-1")
    claimed = await store.claim("owner-2", 30.0, 10)
    assert [c.id for c in claimed] == [host.id]


async def test_renew_all_extends_every_lease_of_the_owner(store: Store, clock: ManualClock) -> None:
    a = await running(store, CONV, owner="owner-1")
    b = await running(store, OTHER, owner="owner-1")
    await running(store, "support/c-3", owner="owner-2")
    clock.advance(20)
    assert sorted(await store.renew_all("owner-1", 300.0), key=lambda h: h.fence.submission_id) == (
        sorted([Held(a.fence), Held(b.fence)], key=lambda h: h.fence.submission_id)
    )
    for sub in (a, b):
        row = await store.get_submission(sub.id)
        assert row is not None and row.lease_expires_at == clock.now + 300.0
    clock.advance(100)  # past owner-2's lease, not past owner-1's renewed ones
    claimed = await store.claim("owner-3", 30.0, 10)
    assert [c.conversation_id for c in claimed] == ["support/c-3"]


async def test_renew_all_leaves_out_claims_the_owner_lost(store: Store, clock: ManualClock) -> None:
    sub = await running(store, owner="owner-1")
    settled = await running(store, OTHER, owner="owner-1")
    await store.settle(
        settled.fence, settlement(settled), outcome="completed", error=None, reply=None
    )
    clock.advance(31)
    [again] = await store.claim("owner-2", 30.0, 10)
    assert again.id == sub.id
    assert await store.renew_all("owner-1", 30.0) == []
    assert await store.renew_all("owner-2", 30.0) == [Held(again.fence)]


async def test_renew_all_says_which_held_submissions_an_abort_was_stamped_on(
    store: Store,
) -> None:
    """The sure way for an owner to hear of an abort whose notice it missed."""
    a = await running(store, CONV, owner="owner-1")
    b = await running(store, OTHER, owner="owner-1")
    assert await store.request_abort(CONV) == [a.id]
    renewed = await store.renew_all("owner-1", 30.0)
    assert sorted(renewed, key=lambda h: h.fence.submission_id) == sorted(
        [Held(a.fence, abort_requested=True), Held(b.fence)], key=lambda h: h.fence.submission_id
    )


async def test_a_released_lease_is_not_renewed(store: Store) -> None:
    sub = await running(store, owner="owner-1")
    assert await store.release(sub.fence, "owner-1")
    assert await store.renew_all("owner-1", 30.0) == []
    [again] = await store.claim("owner-2", 30.0, 10)
    assert again.id == sub.id


async def test_release_makes_the_submission_claimable_at_once(
    store: Store, clock: ManualClock
) -> None:
    clock.set(1000.0)
    sub = await running(store, owner="owner-1")
    assert not await store.release(sub.fence, "owner-2")
    assert await store.release(sub.fence, "owner-1")
    row = await store.get_submission(sub.id)
    assert row is not None and (row.status, row.attempt) == ("running", 1)
    clock.set(1001.0)
    [again] = await store.claim("owner-2", 30.0, 10)
    assert (again.id, again.attempt) == (sub.id, 2)


async def test_a_graceful_release_does_not_count_toward_the_attempts(store: Store) -> None:
    """A shutdown's release is counted in ``releases``, which ``interruptions`` leaves out: a
    few rolling redeploys in a row failed a long submission ``retry_exhausted``."""
    sub = await running(store, owner="owner-1")
    assert await store.release(sub.fence, "owner-1", graceful=True)
    [again] = await store.claim("owner-2", 30.0, 10)
    assert (again.attempt, again.releases, again.interruptions) == (2, 1, 1)
    assert await store.release(again.fence, "owner-2")  # a failed attempt's: counted
    [third] = await store.claim("owner-1", 30.0, 10)
    assert (third.attempt, third.releases, third.interruptions) == (3, 1, 2)
    assert not await store.release(sub.fence, "owner-1", graceful=True)  # not its claim now
    row = await store.get_submission(sub.id)
    assert row is not None and row.releases == 1 and row.to_json()["releases"] == 1


async def test_expire_owners_expires_only_their_leases(store: Store, clock: ManualClock) -> None:
    clock.set(1000.0)
    a = await running(store, CONV, owner="dead")
    clock.set(1000.0)
    await running(store, OTHER, owner="alive")
    assert await store.expire_owners(["dead", "nobody"]) == 1
    clock.set(1001.0)
    claimed = await store.claim("owner-3", 30.0, 10)
    assert [(c.id, c.attempt) for c in claimed] == [(a.id, 2)]


async def test_lease_owners_lists_owners_of_running_submissions(store: Store) -> None:
    assert await store.lease_owners() == []
    await running(store, CONV, owner="owner-b")
    await running(store, OTHER, owner="owner-a")
    await running(store, "support/c-3", owner="owner-a")
    assert sorted(await store.lease_owners()) == ["owner-a", "owner-b"]


# --- abort and settlement --------------------------------------------------------------------


async def test_request_abort_stamps_every_unsettled_submission(store: Store) -> None:
    done = await running(store)
    await store.settle(done.fence, settlement(done), outcome="completed", error=None, reply="")
    live = await running(store)
    waiting = await admitted(store)
    elsewhere = await admitted(store, OTHER)
    assert await store.request_abort(CONV) == [live.id, waiting.id]
    for sid in (live.id, waiting.id):
        row = await store.get_submission(sid)
        assert row is not None and row.abort_requested_at is not None
    for sid in (done.id, elsewhere.id):
        row = await store.get_submission(sid)
        assert row is not None and row.abort_requested_at is None


async def test_request_abort_keeps_the_first_stamp(store: Store) -> None:
    sub = await admitted(store)
    assert await store.request_abort(CONV) == [sub.id]
    first = await store.get_submission(sub.id)
    assert await store.request_abort(CONV) == [sub.id]
    second = await store.get_submission(sub.id)
    assert first is not None and second is not None
    assert second.abort_requested_at == first.abort_requested_at


async def test_request_abort_without_unsettled_work_stamps_nothing(store: Store) -> None:
    assert await store.request_abort("support/nobody") == []


async def test_settle_writes_the_outcome_and_the_record_once(store: Store) -> None:
    sub = await running(store)
    error = {"type": "timeout", "message": "too slow", "interrupted_tools": []}
    offset = await store.settle(
        sub.fence,
        settlement(sub, "failed", None),
        outcome="failed",
        error=error,
        reply=None,
        records_before=[Signal(id="sig", signal_type="submission_interrupted")],
    )
    assert offset == 2
    assert await ids(store) == [f"{CONV}:created", "sig", f"{sub.id}:settled"]
    row = await store.get_submission(sub.id)
    assert row is not None
    assert (row.status, row.outcome, row.error, row.reply) == ("settled", "failed", error, None)
    assert row.settled_at is not None and row.lease_expires_at is None


async def test_settling_twice_is_fenced_out(store: Store) -> None:
    sub = await running(store)
    await store.settle(sub.fence, settlement(sub), outcome="completed", error=None, reply="a")
    with pytest.raises(FencedOut):
        await store.settle(sub.fence, settlement(sub), outcome="completed", error=None, reply="a")
    assert await last_offset(store, CONV) == 1


async def test_settling_from_a_stale_attempt_is_fenced_out(
    store: Store, clock: ManualClock
) -> None:
    clock.set(1000.0)
    sub = await running(store)
    clock.set(2000.0)
    await store.claim("owner-2", 30.0, 1)
    with pytest.raises(FencedOut):
        await store.settle(sub.fence, settlement(sub), outcome="completed", error=None, reply="")
    row = await store.get_submission(sub.id)
    assert row is not None and row.status == "running"


async def test_join_marks_a_queued_submission_joined_and_appends_its_input(
    store: Store,
) -> None:
    host = await running(store)
    guest = await admitted(store)
    assert await store.join(host.fence, guest.id, [msg(1, guest.id)])
    row = await store.get_submission(guest.id)
    assert row is not None
    assert (row.status, row.joined_to) == ("joined", host.id)
    assert row.started_at is not None
    assert await ids(store) == [f"{CONV}:created", "m1"]


async def test_settling_a_host_settles_its_joined_submissions(store: Store) -> None:
    host = await running(store)
    guest = await admitted(store)
    await store.join(host.fence, guest.id, [msg(1, guest.id)])
    offset = await store.settle(
        host.fence, settlement(host), outcome="completed", error=None, reply="both answered"
    )
    records = await store.read(CONV)
    assert offset == 2
    assert [r.id for r in records] == [
        f"{CONV}:created",
        "m1",
        f"{host.id}:settled",
        f"{guest.id}:settled",
    ]
    own = records[-1]
    assert isinstance(own, SubmissionSettled)
    assert (own.submission_id, own.outcome, own.reply) == (guest.id, "completed", "both answered")
    row = await store.get_submission(guest.id)
    assert row is not None
    assert (row.status, row.outcome, row.reply) == ("joined", "completed", "both answered")
    assert row.settled_at is not None


async def test_a_settlement_with_records_before_it_settles_every_joined_in_join_order(
    store: Store,
) -> None:
    host = await running(store)
    first, second = await admitted(store), await admitted(store)
    assert await store.join(host.fence, first.id, [msg(1, first.id)])
    assert await store.join(host.fence, second.id, [msg(2, second.id)])
    before = msg(3, host.id)
    offset = await store.settle(
        host.fence,
        settlement(host),
        outcome="failed",
        error={"type": "x"},
        reply=None,
        records_before=[before],
    )
    records = await store.read(CONV)
    assert [r.id for r in records] == [
        f"{CONV}:created",
        "m1",
        "m2",
        "m3",
        f"{host.id}:settled",
        f"{first.id}:settled",
        f"{second.id}:settled",
    ]
    assert offset == 4
    assert [r.offset for r in records] == list(range(7))
    for sub in (first, second):
        row = await store.get_submission(sub.id)
        assert row is not None
        assert (row.status, row.outcome, row.error) == ("joined", "failed", {"type": "x"})
    assert await last_offset(store, CONV) == 6


async def test_join_fails_unless_the_target_is_queued_in_that_conversation(
    store: Store,
) -> None:
    host = await running(store, CONV)
    elsewhere = await admitted(store, OTHER)
    assert not await store.join(host.fence, elsewhere.id, [msg(1, elsewhere.id)])
    assert not await store.join(host.fence, "s_missing", [msg(2)])
    guest = await admitted(store, CONV)
    assert await store.join(host.fence, guest.id, [msg(3, guest.id)])
    assert not await store.join(host.fence, guest.id, [msg(4, guest.id)])
    assert await ids(store) == [f"{CONV}:created", "m3"]


async def test_join_from_a_stale_host_is_fenced_out(store: Store, clock: ManualClock) -> None:
    clock.set(1000.0)
    host = await running(store)
    guest = await admitted(store)
    clock.set(2000.0)
    await store.claim("owner-2", 30.0, 10)
    with pytest.raises(FencedOut):
        await store.join(host.fence, guest.id, [msg(1, guest.id)])
    row = await store.get_submission(guest.id)
    assert row is not None and row.status == "queued"


async def test_join_many_joins_in_order_and_stops_at_the_first_that_cannot(store: Store) -> None:
    host = await running(store, CONV)
    assert await store.append(CONV, [msg(1, host.id)], fence=host.fence) == [1]
    first, second = await admitted(store, CONV), await admitted(store, CONV)
    elsewhere, third = await admitted(store, OTHER), await admitted(store, CONV)
    joins = [
        (first.id, [msg(2, first.id)]),
        (second.id, [msg(3, second.id)]),
        (elsewhere.id, [msg(4, elsewhere.id)]),
        (third.id, [msg(5, third.id)]),
    ]
    assert await store.join_many(host.fence, joins) == 2
    records = await store.read(CONV)
    assert [(r.id, r.offset) for r in records[1:]] == [("m1", 1), ("m2", 2), ("m3", 3)]
    for sub, status in ((first, "joined"), (second, "joined"), (third, "queued")):
        row = await store.get_submission(sub.id)
        assert row is not None and row.status == status
        assert row.joined_to == (host.id if status == "joined" else None)
    assert await store.join_many(host.fence, [(third.id, [msg(5, third.id)])]) == 1
    assert await store.join_many(host.fence, []) == 0


async def test_an_abort_stamps_and_lists_the_submissions_joined_to_the_response(
    store: Store,
) -> None:
    """A joined submission is unsettled until its host settles: the abort left it unstamped and
    out of its answer, though it then settled aborted with the host."""
    host = await running(store, CONV)
    guest = await admitted(store, CONV)
    await store.join(host.fence, guest.id, [msg(1, guest.id)])
    assert await store.request_abort(CONV) == [host.id, guest.id]
    row = await store.get_submission(guest.id)
    assert row is not None and row.status == "joined" and row.abort_requested_at is not None
    aborted = {"type": "aborted", "message": "the submission was aborted"}
    await store.settle(host.fence, settlement(host), outcome="aborted", error=aborted, reply=None)
    assert await store.request_abort(CONV) == []  # settled with the host: nothing left


async def test_join_many_before_the_host_appended_joins_them_all(store: Store) -> None:
    host = await running(store, CONV)
    guests = [await admitted(store, CONV) for _ in range(3)]
    joins = [(g.id, [msg(n, g.id)]) for n, g in enumerate(guests, start=1)]
    assert await store.join_many(host.fence, joins) == 3
    assert await ids(store) == [f"{CONV}:created", "m1", "m2", "m3"]


async def test_join_many_from_a_stale_host_is_fenced_out_and_joins_none(
    store: Store, clock: ManualClock
) -> None:
    clock.set(1000.0)
    host = await running(store)
    assert await store.append(CONV, [msg(1, host.id)], fence=host.fence) == [1]
    guests = [await admitted(store) for _ in range(2)]
    clock.set(2000.0)
    await store.claim("owner-2", 30.0, 10)
    with pytest.raises(FencedOut):
        await store.join_many(host.fence, [(g.id, [msg(n, g.id)]) for n, g in enumerate(guests)])
    for guest in guests:
        row = await store.get_submission(guest.id)
        assert row is not None and row.status == "queued"


# --- events --------------------------------------------------------------------------------


async def test_an_append_wakes_a_waiter_of_its_conversation(store: Store) -> None:
    await admitted(store)
    waiter = asyncio.create_task(store.events.wait(CONV, timeout=5.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await store.append(CONV, [AssistantMessageStarted(id="a1", message_id="a1", model="x")])
    await asyncio.wait_for(waiter, 1.0)
    assert [r.offset for r in await store.read(CONV, after=0)] == [1]


class Heard:
    """Every event a store publishes, after its commit."""

    def __init__(self, store: Store) -> None:
        self.events: list[Event] = []
        self.stop = store.events.listen(self.events.append)

    def kinds(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]


async def settle_published(store: Store) -> None:
    await asyncio.sleep(0.05)  # events are delivered on the loop right after the commit


async def test_admission_publishes_admitted(store: Store) -> None:
    heard = Heard(store)
    sub = await admitted(store)
    await settle_published(store)
    [event] = heard.kinds("admitted")
    assert (event.conversation_id, event.submission_id) == (CONV, sub.id)


async def test_request_abort_publishes_abort_only_when_it_stamped(store: Store) -> None:
    heard = Heard(store)
    await admitted(store)
    await store.request_abort(CONV)
    await store.request_abort(OTHER)
    await settle_published(store)
    assert [e.conversation_id for e in heard.kinds("abort")] == [CONV]


async def test_release_and_expiry_publish_released(store: Store) -> None:
    a = await running(store, CONV, owner="owner-1")
    b = await running(store, OTHER, owner="dead")
    heard = Heard(store)
    await store.release(a.fence, "owner-1")
    await store.expire_owners(["dead"])
    await settle_published(store)
    assert [e.submission_id for e in heard.kinds("released")] == [a.id, b.id]


async def test_settling_wakes_the_waiters_of_the_host_and_its_joined(store: Store) -> None:
    host = await running(store)
    guest = await admitted(store)
    assert await store.join(host.fence, guest.id, [msg(1, guest.id)])
    host_waiter = store.events.watch_settled(host.id)
    guest_waiter = store.events.watch_settled(guest.id)
    try:
        await store.settle(host.fence, settlement(host), outcome="completed", error=None, reply="")
        rows = await asyncio.wait_for(asyncio.gather(host_waiter, guest_waiter), 1.0)
    finally:
        store.events.unwatch_settled(host.id, host_waiter)
        store.events.unwatch_settled(guest.id, guest_waiter)
    # Settled by this handle: each waiter gets its row as the settlement committed it.
    assert rows == [await store.get_submission(host.id), await store.get_submission(guest.id)]
    assert [(r.status, r.outcome) for r in rows if r is not None] == [
        ("settled", "completed"),
        ("joined", "completed"),
    ]


async def test_a_failed_write_publishes_nothing(store: Store) -> None:
    sub = await running(store)
    heard = Heard(store)
    await store.append(CONV, [msg(1)])
    with pytest.raises(IntegrityError):
        await store.append(CONV, [msg(2), msg(1, content="other")])
    with pytest.raises(FencedOut):
        await store.settle(
            Fence(sub.id, 99), settlement(sub), outcome="failed", error=None, reply=None
        )
    await settle_published(store)
    assert [(e.kind, e.offset) for e in heard.events] == [("appended", 1)]


# --- two handles on one database ---------------------------------------------------------------


async def test_concurrent_claimers_take_each_submission_once(
    store_pair: tuple[Store, Store],
) -> None:
    one, two = store_pair
    made = [await admitted(one, f"support/c-{n}") for n in range(20)]
    results = await asyncio.gather(
        *(handle.claim(f"owner-{i}", 30.0, 3) for i in range(8) for handle in (one, two))
    )
    claimed = [sub.id for batch in results for sub in batch]
    assert len(claimed) == len(set(claimed))
    assert sorted(claimed) == sorted(m.id for m in made)


async def test_one_conversation_is_claimed_by_one_claimer_at_a_time(
    store_pair: tuple[Store, Store],
) -> None:
    one, two = store_pair
    for n in range(3):
        await admitted(one, CONV, f"m{n}")
    results = await asyncio.gather(one.claim("owner-1", 30.0, 10), two.claim("owner-2", 30.0, 10))
    assert sum(len(batch) for batch in results) == 1


async def test_a_stale_handle_is_fenced_out_of_every_write(
    store_pair: tuple[Store, Store], clock: ManualClock
) -> None:
    one, two = store_pair
    stale = await running(one, owner="owner-1")
    guest = await admitted(one)
    clock.advance(31)  # owner-1 froze past its lease; owner-2 takes over through the other handle
    [fresh] = await two.claim("owner-2", 30.0, 10)
    assert fresh.id == stale.id and fresh.attempt == stale.attempt + 1
    with pytest.raises(FencedOut):
        await one.append(CONV, [msg(1, stale.id)], fence=stale.fence)
    with pytest.raises(FencedOut):
        await one.settle(stale.fence, settlement(stale), outcome="completed", error=None, reply="")
    with pytest.raises(FencedOut):
        await one.join(stale.fence, guest.id, [msg(2, guest.id)])
    assert not await one.release(stale.fence, "owner-1")
    assert await one.renew_all("owner-1", 30.0) == []
    assert await ids(two) == [f"{CONV}:created"]
    await two.append(CONV, [msg(1, fresh.id)], fence=fresh.fence)
    row = await two.get_submission(stale.id)
    assert row is not None and (row.status, row.attempt, row.lease_owner) == (
        "running",
        fresh.attempt,
        "owner-2",
    )


async def test_events_of_one_handle_reach_the_other(store_pair: tuple[Store, Store]) -> None:
    one, two = store_pair
    sub = await running(one)
    waiter = two.events.watch_settled(sub.id)
    try:
        await one.settle(sub.fence, settlement(sub), outcome="completed", error=None, reply="")
        row = await asyncio.wait_for(waiter, 5.0)
        # Settled by a peer, the waiter is woken without the row, and reads it; by its own
        # handle (SQLite's pair is one handle), with it.
        assert row is None if one is not two else row == await two.get_submission(sub.id)
    finally:
        two.events.unwatch_settled(sub.id, waiter)


async def test_a_claim_of_aborting_work_only_takes_queued_heads_whose_abort_is_stamped(
    store: Store,
) -> None:
    """What a process whose every worker is busy still takes: an aborted queued submission
    settles at once, with no model work (it waited for a free worker, its read timing out)."""
    plain = (await store.admit(new())).submission
    aborted = (await store.admit(new(OTHER))).submission
    assert await store.request_abort(OTHER) == [aborted.id]
    taken = await store.claim("owner-1", 30.0, 10, aborting_only=True)
    assert [(s.id, s.status, s.attempt) for s in taken] == [(aborted.id, "running", 1)]
    rest = await store.claim("owner-1", 30.0, 10)
    assert [s.id for s in rest] == [plain.id]
