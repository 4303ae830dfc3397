"""Admissions to conversations a PostgreSQL store knows go in groups: many in one round trip
and one commit. Each is answered as if it went alone: its own head, its own idempotency key,
its payload exactly as given, and a group whose answer was lost is read back, never admitted
twice."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from pgcluster import Cluster

from hearth.store import NewSubmission
from hearth.store import postgres_ops as ops
from hearth.store.events import ADMITTED, APPENDED, Event
from hearth.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio

ODD = "quote ' double \" backslash \\ %(c)s %s newline\n é 漢 \u2028"


@pytest.fixture
def store(pg_store: PostgresStore) -> PostgresStore:
    return pg_store


def new(conversation_id: str, text: str, key: str | None = None) -> NewSubmission:
    return NewSubmission(conversation_id, "support", "message", {"text": text}, idempotency_key=key)


async def known(store: PostgresStore, count: int, prefix: str = "g") -> list[str]:
    """``count`` conversations admitted to once (so the store knows them), each with one
    queued submission at its head."""
    names = [f"support/{prefix}-{n}" for n in range(count)]
    for name in names:
        await store.admit(new(name, "first"))
    return names


async def rows(pg_cluster: Cluster, store: PostgresStore) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as conn:
        cursor = await conn.execute(
            f"SELECT conversation_id, payload, is_head FROM {store.schema}.submissions ORDER BY seq"
        )
        return await cursor.fetchall()


def spied(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the groups written (their statement answered)."""
    written: list[int] = []
    real = ops.admit_group

    async def spy(conn: Any, admissions: Any, outbox: Any, now: Any) -> Any:
        answers = await real(conn, admissions, outbox, now)
        written.append(len(admissions))
        return answers

    monkeypatch.setattr(ops, "admit_group", spy)
    return written


def cut_after_sending(monkeypatch: pytest.MonkeyPatch, *, committed: bool) -> list[int]:
    """Every group's connection breaks once its statements went out (after they committed,
    with ``committed``); the sizes of the groups cut."""
    real = ops.admit_group
    lost: list[int] = []

    async def cut(conn: Any, admissions: Any, outbox: Any, now: Any) -> Any:
        if committed:
            await real(conn, admissions, outbox, now)
        lost.append(len(admissions))
        raise psycopg.OperationalError("the connection was lost (planted)")

    monkeypatch.setattr(ops, "admit_group", cut)
    return lost


async def test_many_admissions_at_once_share_statements_and_each_is_answered_as_alone(
    store: PostgresStore, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = await known(store, 24)
    written = spied(monkeypatch)
    admitted = await asyncio.gather(*(store.admit(new(name, f"{ODD} {name}")) for name in names))
    assert written and sum(written) >= len(names) - 2  # all but the first went in groups
    for name, admission in zip(names, admitted, strict=True):
        sub = admission.submission
        assert (sub.conversation_id, sub.payload, sub.status) == (
            name,
            {"text": f"{ODD} {name}"},
            "queued",
        )
        assert not admission.deduplicated and admission.offset == 0
        assert await store.get_submission(sub.id) == sub
    stored = await rows(pg_cluster, store)
    assert len(stored) == 2 * len(names)
    # Each conversation's head is still its first submission: the second queued behind it.
    heads = {c: p for c, p, head in stored if head}
    assert heads == {name: '{"text":"first"}' for name in names}


async def test_admissions_to_one_conversation_at_once_keep_one_head(
    store: PostgresStore, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    [name] = await known(store, 1, "one")
    others = await known(store, 8)  # other conversations, so that groups form
    written = spied(monkeypatch)
    admitted = await asyncio.gather(
        *(store.admit(new(name, f"m{n}")) for n in range(6)),
        *(store.admit(new(other, "x")) for other in others),
    )
    assert written and max(written) > 1
    mine = [a.submission for a in admitted[:6]]
    assert [s.payload["text"] for s in mine] == [f"m{n}" for n in range(6)]
    listed = await store.list_submissions(name, limit=100)
    assert listed[0].payload["text"] == "first"
    assert sorted(s.id for s in listed[1:]) == sorted(s.id for s in mine)
    stored = [r for r in await rows(pg_cluster, store) if r[0] == name]
    assert [head for _, _, head in stored] == [True] + [False] * 6
    # The head moves on in admission order once the first settles: one head at a time.
    assert len(await store.claim("owner-1", 30.0, 100)) == 1 + len(others)


async def test_an_idempotency_key_sent_twice_at_once_admits_once(
    store: PostgresStore, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = await known(store, 6)
    written = spied(monkeypatch)
    admitted = await asyncio.gather(
        *(store.admit(new(name, "once", key="k-1")) for name in names),
        *(store.admit(new(name, "once", key="k-1")) for name in names),
    )
    assert written and max(written) > 1
    for name, first, second in zip(names, admitted[:6], admitted[6:], strict=True):
        assert first.submission.id == second.submission.id
        assert sorted([first.deduplicated, second.deduplicated]) == [False, True]
        assert first.submission.conversation_id == name
    assert len(await rows(pg_cluster, store)) == 2 * len(names)


@pytest.mark.parametrize("committed", [True, False])
async def test_a_group_whose_answer_is_lost_is_read_back_and_never_admitted_twice(
    store: PostgresStore,
    pg_cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    committed: bool,
) -> None:
    """The connection breaks after a group's statement went out: whether or not it committed,
    every admission of the group is answered once, with one row each."""
    names = await known(store, 12)
    lost = cut_after_sending(monkeypatch, committed=committed)
    admitted = await asyncio.gather(*(store.admit(new(name, "again")) for name in names))
    assert lost and max(lost) > 1  # groups formed, and each lost its answer
    assert {a.submission.conversation_id for a in admitted} == set(names)
    assert all(a.submission.payload == {"text": "again"} for a in admitted)
    assert all(not a.deduplicated for a in admitted)
    stored = await rows(pg_cluster, store)
    assert sorted(c for c, p, _ in stored if p == '{"text":"again"}') == sorted(names)
    for a in admitted:
        assert await store.get_submission(a.submission.id) == a.submission


async def test_admissions_to_new_conversations_go_in_groups_and_create_each_once(
    store: PostgresStore, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst to conversations this process has never seen: the first admission of each
    creates it (its ``conversation_created`` record at offset 0), in a group with the others';
    the ones behind it, in later groups, find it made."""
    names = [f"support/new-{n}" for n in range(12)]
    creating: list[int] = []
    real = ops.admit_group

    async def spy(conn: Any, admissions: Any, outbox: Any, now: Any) -> Any:
        creating.append(sum(1 for _, _, known in admissions if not known))
        return await real(conn, admissions, outbox, now)

    monkeypatch.setattr(ops, "admit_group", spy)
    heard: list[Event] = []
    store.events.listen(heard.append)
    admitted = await asyncio.gather(
        *(store.admit(new(name, f"{ODD} {k}")) for k in range(3) for name in names)
    )
    assert creating and max(creating) > 1  # new conversations were created in groups
    # Each creation is announced once (readers of a new conversation wake), each admission too.
    created = sorted(e.conversation_id for e in heard if e.kind == APPENDED and e.offset == 0)
    assert created == sorted(names)
    assert sorted(e.submission_id for e in heard if e.kind == ADMITTED) == sorted(
        a.submission.id for a in admitted
    )
    for name in names:
        records = await store.read(name)
        assert [(r.offset, r.type) for r in records] == [(0, "conversation_created")]
        mine = [a for a in admitted if a.submission.conversation_id == name]
        assert sorted(a.submission.payload["text"] for a in mine) == [
            f"{ODD} {k}" for k in range(3)
        ]
        assert all(a.offset == 0 and not a.deduplicated for a in mine)
    stored = await rows(pg_cluster, store)
    assert len(stored) == 3 * len(names)
    heads = [c for c, _, head in stored if head]
    assert sorted(heads) == sorted(names)  # one head each: the first admitted


@pytest.mark.parametrize("committed", [True, False])
async def test_a_lost_group_that_created_conversations_is_read_back_once(
    store: PostgresStore,
    pg_cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    committed: bool,
) -> None:
    names = [f"support/lost-{n}" for n in range(10)]
    lost = cut_after_sending(monkeypatch, committed=committed)
    admitted = await asyncio.gather(*(store.admit(new(name, "hello")) for name in names))
    assert lost and max(lost) > 1
    assert sorted(a.submission.conversation_id for a in admitted) == sorted(names)
    for name in names:
        assert [r.type for r in await store.read(name)] == ["conversation_created"]
    stored = await rows(pg_cluster, store)
    assert sorted(c for c, _, head in stored if head) == sorted(names)
    assert len(stored) == len(names)
    for a in admitted:
        assert await store.get_submission(a.submission.id) == a.submission
