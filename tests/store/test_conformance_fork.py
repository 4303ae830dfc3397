"""The store contract for forks (SPEC §17): every store implementation passes these."""

from __future__ import annotations

import pytest
from test_conformance import CONV, admitted, last_offset, msg, running, settlement

from hearth.errors import ConversationExists, ConversationNotFound, InvalidInput, NotARestPoint
from hearth.records import (
    ChildConversationLinked,
    Compaction,
    ConversationCreated,
    Record,
    StateWrite,
)
from hearth.store import NewSubmission, Store, Submission, postgres_ops, sqlite_ops
from hearth.store.rules import rest_points

pytestmark = pytest.mark.anyio

FORK = "support/c-1-fork"


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forks copied a few records at a time, as long conversations are: the chunks' seams
    are crossed by every case."""
    monkeypatch.setattr(sqlite_ops, "FORK_CHUNK", 2)
    monkeypatch.setattr(postgres_ops, "FORK_CHUNK", 2)


async def turn(store: Store, text: str, *extra: Record) -> tuple[Submission, int]:
    """One submission run to completion: its message, ``extra`` records, its settlement.
    Returns it and the offset of its settlement."""
    sub = await running(store)
    await store.append(CONV, [msg(await last_offset(store, CONV) + 1, sub.id, text), *extra],
                       fence=sub.fence)  # fmt: skip
    at = await store.settle(
        sub.fence, settlement(sub), outcome="completed", error=None, reply=f"re: {text}"
    )
    return sub, at


def state(name: str, value: object, n: int) -> StateWrite:
    return StateWrite(id=f"w{n}", name=name, value=value)


async def test_a_fork_copies_the_records_up_to_the_offset_with_fresh_ids_at_their_offsets(
    store: Store,
) -> None:
    _, first = await turn(store, "one")
    await turn(store, "two")
    source = await store.read(CONV)
    info = await store.fork(CONV, first, FORK)
    assert (info.conversation_id, info.agent, info.last_offset) == (FORK, "support", first)
    forked = await store.read(FORK)
    created = forked[0]
    assert isinstance(created, ConversationCreated)
    assert (created.offset, created.conversation_id, created.agent) == (0, FORK, "support")
    assert created.forked_from == {"conversation_id": CONV, "offset": first}
    assert created.parent is None
    copies = forked[1:]
    assert [r.offset for r in copies] == list(range(1, first + 1))
    originals = source[1 : first + 1]
    assert [r.type for r in copies] == [r.type for r in originals]
    assert not {r.id for r in copies} & {r.id for r in source}
    for copy, original in zip(copies, originals, strict=True):
        mine, theirs = copy.to_json(), original.to_json()
        assert mine.pop("id") != theirs.pop("id")
        assert mine == theirs  # the same record in every other field


async def test_the_fork_has_the_state_as_of_the_offset_and_no_submissions(store: Store) -> None:
    _, first = await turn(store, "one", state("plan", "a", 1), state("seen", 1, 2))
    await turn(store, "two", state("plan", "b", 3))
    await store.fork(CONV, first, FORK)
    assert await store.get_state(FORK) == {"plan": "a", "seen": 1}
    assert await store.get_state(CONV) == {"plan": "b", "seen": 1}
    assert await store.list_submissions(FORK) == []


async def test_the_source_is_not_touched(store: Store) -> None:
    _, first = await turn(store, "one", state("plan", "a", 1))
    before = [r.to_json() for r in await store.read(CONV)]
    subs = await store.list_submissions(CONV)
    await store.fork(CONV, first, FORK)
    assert [r.to_json() for r in await store.read(CONV)] == before
    assert await store.list_submissions(CONV) == subs
    assert await store.get_state(CONV) == {"plan": "a"}


async def test_a_fork_at_0_is_an_empty_conversation(store: Store) -> None:
    await turn(store, "one")
    await store.fork(CONV, 0, FORK)
    [created] = await store.read(FORK)
    assert isinstance(created, ConversationCreated)
    assert created.forked_from == {"conversation_id": CONV, "offset": 0}


async def test_a_fork_can_be_forked_and_keeps_compaction_offsets(store: Store) -> None:
    summary = Compaction(id="cmp", summary="earlier", first_kept_offset=2)
    _, first = await turn(store, "one", summary)
    await store.fork(CONV, first, FORK)
    await store.fork(FORK, first, "support/c-1-fork-2")
    again = await store.read("support/c-1-fork-2")
    created = again[0]
    assert isinstance(created, ConversationCreated)
    assert created.forked_from == {"conversation_id": FORK, "offset": first}
    [kept] = [r for r in again if isinstance(r, Compaction)]
    assert kept.first_kept_offset == 2


async def test_a_child_conversation_is_referenced_not_copied(store: Store) -> None:
    child = "helper/c-1-child"
    link = ChildConversationLinked(id="link", tool_call_id="call-1", child_conversation_id=child)
    host = await running(store)
    parent = {"conversation_id": CONV, "tool_call_id": "call-1"}
    created = ConversationCreated(
        id=f"{child}:created", agent="helper", conversation_id=child, parent=parent
    )
    await store.append(CONV, [msg(1, host.id), link], fence=host.fence)
    await store.append(child, [created, msg(7)], fence=host.fence)
    at = await store.settle(host.fence, settlement(host), outcome="completed", error=None, reply="")
    await store.fork(CONV, at, FORK)
    [copied] = [r for r in await store.read(FORK) if isinstance(r, ChildConversationLinked)]
    assert copied.child_conversation_id == child
    assert [r.id for r in await store.read(child)] == [f"{child}:created", "m7"]


async def test_an_offset_that_is_no_rest_point_is_refused_naming_the_nearest(
    store: Store,
) -> None:
    _, first = await turn(store, "one")
    _, second = await turn(store, "two")
    with pytest.raises(NotARestPoint) as refused:
        await store.fork(CONV, first + 1, FORK)
    assert refused.value.rest_points == [first, second]
    assert await store.get_conversation(FORK) is None


async def test_a_settlement_with_a_submission_open_at_it_is_no_rest_point(store: Store) -> None:
    host = await running(store)
    await admitted(store, text="queued behind")  # admitted before the host settles
    await store.append(CONV, [msg(1, host.id)], fence=host.fence)
    at = await store.settle(host.fence, settlement(host), outcome="completed", error=None, reply="")
    with pytest.raises(NotARestPoint) as refused:
        await store.fork(CONV, at, FORK)
    assert refused.value.rest_points == [0]


async def test_joined_submissions_make_the_rest_point_their_last_settlement(store: Store) -> None:
    host = await running(store)
    guest = await admitted(store, text="joins")
    await store.append(CONV, [msg(1, host.id)], fence=host.fence)
    assert await store.join(host.fence, guest.id, [msg(2, guest.id)])
    at = await store.settle(host.fence, settlement(host), outcome="completed", error=None, reply="")
    assert await last_offset(store, CONV) == at + 1  # the guest's own settlement
    with pytest.raises(NotARestPoint):
        await store.fork(CONV, at, FORK)
    await store.fork(CONV, at + 1, FORK)
    assert await last_offset(store, FORK) == at + 1


async def test_a_fork_of_a_fork_has_the_rest_points_of_its_origin(store: Store) -> None:
    """A fork's copied records have no submission rows: every copied settlement counted as a
    rest point, and a fork of it could be cut between a host's settlement and that of the
    message joined to it."""
    host = await running(store)
    guest = await admitted(store, text="joins")
    await store.append(CONV, [msg(1, host.id)], fence=host.fence)
    assert await store.join(host.fence, guest.id, [msg(2, guest.id)])
    at = await store.settle(host.fence, settlement(host), outcome="completed", error=None, reply="")
    await store.fork(CONV, at + 1, FORK)
    with pytest.raises(NotARestPoint) as refused:
        await store.fork(FORK, at, f"{FORK}-2")
    assert refused.value.rest_points == [0, at + 1]
    await store.fork(FORK, at + 1, f"{FORK}-2")
    _, later = await turn_on(store, FORK, "on the fork")  # its own settlement, past the cut
    await store.fork(f"{FORK}", later, f"{FORK}-3")


async def turn_on(store: Store, conversation_id: str, text: str) -> tuple[Submission, int]:
    await store.admit(NewSubmission(conversation_id, "support", "message", {"message": text}))
    (sub,) = await store.claim("owner-1", 30.0, 1)
    n = await last_offset(store, conversation_id) + 1
    await store.append(conversation_id, [msg(n, sub.id, text)], fence=sub.fence)
    at = await store.settle(sub.fence, settlement(sub), outcome="completed", error=None, reply="")
    return sub, at


async def test_a_submission_admitted_after_a_settlement_does_not_block_it(store: Store) -> None:
    _, first = await turn(store, "one")
    later = await running(store)  # admitted at the settlement's offset, running now
    await store.append(CONV, [msg(first + 1, later.id)], fence=later.fence)
    await store.fork(CONV, first, FORK)
    assert await last_offset(store, FORK) == first


async def test_bad_forks_store_nothing(store: Store) -> None:
    _, first = await turn(store, "one")
    await store.fork(CONV, first, FORK)
    with pytest.raises(ConversationNotFound):
        await store.fork("support/nobody", 0, "support/x")
    with pytest.raises(ConversationExists):
        await store.fork(CONV, first, FORK)
    with pytest.raises(ConversationExists):
        await store.fork(CONV, 0, CONV)
    with pytest.raises(ConversationExists):  # an existing target is named before the offset
        await store.fork(CONV, first + 5, FORK)
    with pytest.raises(InvalidInput):
        await store.fork(CONV, first + 1, "support/y")
    with pytest.raises(InvalidInput):
        await store.fork(CONV, -1, "support/y")
    for gone in ("support/x", "support/y"):
        assert await store.get_conversation(gone) is None
    assert await last_offset(store, FORK) == first


# --- the rest points, as a pure rule ---------------------------------------------------------


@pytest.mark.parametrize(
    ("settlements", "submissions", "expected"),
    [
        ([], [], [0]),
        ([3, 7], [(0, 3), (3, 7)], [0, 3, 7]),
        ([3, 7], [(0, 3), (2, 7)], [0, 7]),  # the second was admitted before the first settled
        ([3, 4], [(0, 3), (1, 4)], [0, 4]),  # a joined guest settles right after its host
        ([3], [(0, 3), (3, None)], [0, 3]),  # admitted after the settlement, still running
        ([3], [(0, 3), (1, None)], [0]),  # admitted before it, never settled
    ],
)
def test_rest_points(
    settlements: list[int], submissions: list[tuple[int, int | None]], expected: list[int]
) -> None:
    assert rest_points(settlements, submissions) == expected
