"""A heartbeat renews every lease of its process in one statement, on every store: counted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest

from hearth.store import NewSubmission, Store
from hearth.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio

# (SET: the session settings of a connection the pool happened to open meanwhile, not the action's)
_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "SET ")


@contextmanager
def _postgres_statements(seen: list[str]) -> Iterator[None]:
    import psycopg

    execute = psycopg.AsyncCursor.execute

    async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(query))
        return await execute(self, query, *args, **kwargs)

    psycopg.AsyncCursor.execute = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]


async def statements(store: Store, action: Callable[[], Awaitable[Any]]) -> list[str]:
    """The statements (transaction control aside) the store sends while ``action`` runs."""
    seen: list[str] = []
    if isinstance(store, SQLiteStore):

        def traced(statement: str) -> None:
            # Entering a trigger (the activity bucket's) traces its statement a second time.
            if not seen or seen[-1] != statement:
                seen.append(statement)

        await store._write(lambda conn, _: conn.set_trace_callback(traced))
        try:
            await action()
        finally:
            await store._write(lambda conn, _: conn.set_trace_callback(None))
    else:
        from hearth.store.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        await store.notified()  # earlier writes' notifications are not this action's
        with _postgres_statements(seen):
            await action()
    return [s for s in seen if not s.lstrip().upper().startswith(_CONTROL)]


@pytest.mark.parametrize("leases", [1, 50])
async def test_a_heartbeat_renews_every_lease_in_one_statement(store: Store, leases: int) -> None:
    for i in range(leases):
        await store.admit(NewSubmission(f"support/c{i}", "support", "message", {"message": "hi"}))
    assert len(await store.claim("owner-1", 30.0, leases)) == leases
    renewed: list[Any] = []

    async def beat() -> None:
        renewed.extend(await store.renew_all("owner-1", 30.0))

    sent = await statements(store, beat)
    assert len(renewed) == leases
    assert len(sent) == 1, sent


async def test_a_fenced_append_on_sqlite_reads_its_fence_and_the_stream_end_together() -> None:
    """A step's record on SQLite: one read (the fence and the last offset), the insert and the
    offset's update; a stale fence is still refused before anything is written."""
    from hearth.errors import FencedOut
    from hearth.records import UserMessage

    store = SQLiteStore(":memory:")
    await store.open()
    try:
        conv = "support/c-1"
        sub = (await store.admit(NewSubmission(conv, "support", "message", {"m": 1}))).submission
        [running] = await store.claim("owner-1", 30.0, 1)

        async def step(n: int) -> None:
            record = UserMessage(id=f"m{n}", message_id=f"m{n}", content="x", submission_id=sub.id)
            assert await store.append(conv, [record], fence=running.fence) == [n]

        sent = await statements(store, lambda: step(1))
        assert [s.split()[0] for s in sent] == ["SELECT", "INSERT", "UPDATE"], sent
        await store.expire_owners(["owner-1"])
        assert len(await store.claim("owner-2", 30.0, 1)) == 1  # the next attempt
        with pytest.raises(FencedOut):
            await step(2)
        assert await store.last_offset(conv) == 1
    finally:
        await store.close()


async def test_a_fenced_append_after_the_first_is_one_statement_on_postgres(
    pg_cluster: Any,
) -> None:
    """A step's record is one round trip: fence, offset, insert, notification in one statement.
    When another writer moved the offset meanwhile, the append still lands right, the general
    way, and the next one is a single statement again."""
    from pgcluster import new_schema

    from hearth.records import UserMessage
    from hearth.store.postgres import PostgresStore

    def msg(n: int, submission_id: str) -> UserMessage:
        return UserMessage(id=f"m{n}", message_id=f"m{n}", content="x", submission_id=submission_id)

    schema = new_schema()
    mine, other = (PostgresStore(pg_cluster.conninfo, schema=schema) for _ in range(2))
    await mine.open()
    await other.open()
    try:
        conv = "support/c-1"
        sub = (await mine.admit(NewSubmission(conv, "support", "message", {"m": 1}))).submission
        [running] = await mine.claim("owner-1", 30.0, 1)
        fence = running.fence
        assert await mine.append(conv, [msg(1, sub.id)], fence=fence) == [1]

        async def step(n: int) -> None:
            assert await mine.append(conv, [msg(n, sub.id)], fence=fence) == [n]

        assert len(await statements(mine, lambda: step(2))) == 1
        await other.append(conv, [msg(3, sub.id)])  # another process appends meanwhile
        assert len(await statements(mine, lambda: step(4))) > 1  # the offset moved: general way
        assert len(await statements(mine, lambda: step(5))) == 1
        assert [r.offset for r in await other.read(conv)] == [0, 1, 2, 3, 4, 5]
        assert [r.id for r in await other.read(conv, after=0)] == [f"m{n}" for n in range(1, 6)]
    finally:
        await mine.close()
        await other.close()


async def test_a_one_statement_append_by_a_stale_attempt_is_fenced_out(pg_cluster: Any) -> None:
    from pgcluster import new_schema

    from hearth.errors import FencedOut
    from hearth.records import UserMessage
    from hearth.store.postgres import PostgresStore
    from hearth.testing.clock import ManualClock

    clock = ManualClock()
    store = PostgresStore(pg_cluster.conninfo, schema=new_schema(), clock=clock)
    await store.open()
    try:
        conv = "support/c-1"
        sub = (await store.admit(NewSubmission(conv, "support", "message", {"m": 1}))).submission
        [first] = await store.claim("owner-1", 5.0, 1)
        record = UserMessage(id="m1", message_id="m1", content="x", submission_id=sub.id)
        assert await store.append(conv, [record], fence=first.fence) == [1]
        clock.advance(10)  # the lease runs out; another owner takes the work over
        [second] = await store.claim("owner-2", 30.0, 1)
        assert second.attempt == first.attempt + 1
        clock.advance(1)
        step = UserMessage(id="m1b", message_id="m1b", content="y", submission_id=sub.id)
        assert await store.append(conv, [step], fence=second.fence) == [2]
        assert (
            len(
                await statements(
                    store,
                    lambda: store.append(
                        conv, [step.with_offset(-1).stamped(sub.id, 2)], fence=second.fence
                    ),
                )
            )
            >= 1
        )
        [row] = await store.list_conversations()
        assert row.last_activity == clock.now  # the one-statement append stamps activity too
        late = UserMessage(id="m2", message_id="m2", content="late", submission_id=sub.id)
        with pytest.raises(FencedOut):
            await store.append(conv, [late], fence=first.fence)
        assert [r.id for r in await store.read(conv, after=0)] == ["m1", "m1b"]
    finally:
        await store.close()


@pytest.mark.parametrize("guests", [1, 8])
async def test_postgres_admission_join_and_settlement_take_a_fixed_number_of_statements(
    pg_cluster: Any, guests: int
) -> None:
    """Admitting to a conversation that exists takes one round trip (its lock and its insert in
    one query, no ``BEGIN``); a join 1 statement once the host has appended (its fence, the
    row, the offset and the record together); a settlement 7 however many joined it: their
    settlement records go in one insert and their rows in one update."""
    from pgcluster import new_schema

    from hearth.records import SubmissionSettled, UserMessage
    from hearth.store.postgres import PostgresStore

    store = PostgresStore(pg_cluster.conninfo, schema=new_schema())
    await store.open()
    try:
        conv = "support/c-1"

        def new() -> NewSubmission:
            return NewSubmission(conv, "support", "message", {"message": "hi"})

        host = (await store.admit(new())).submission
        [running] = await store.claim("owner-1", 30.0, 1)
        first = UserMessage(id="h", message_id="h", content="x", submission_id=host.id)
        assert await store.append(conv, [first], fence=running.fence) == [1]
        admitted: list[Any] = []

        async def admit() -> None:
            admitted.append((await store.admit(new())).submission)

        import psycopg

        blocks = 0
        transaction = psycopg.AsyncConnection.transaction

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal blocks
            blocks += 1
            return transaction(self, *args, **kwargs)

        psycopg.AsyncConnection.transaction = counted  # type: ignore[method-assign]
        try:
            for _ in range(guests):
                assert len(await statements(store, admit)) == 1
        finally:
            psycopg.AsyncConnection.transaction = transaction  # type: ignore[method-assign]
        assert blocks == 0
        for n, guest in enumerate(admitted):
            record = UserMessage(
                id=f"m{n}", message_id=f"m{n}", content="x", submission_id=guest.id
            )
            joined = await statements(
                store, lambda g=guest, r=record: store.join(running.fence, g.id, [r])
            )
            assert len(joined) == 1, joined
        settled = SubmissionSettled(
            id=f"{host.id}:settled", submission_id=host.id, outcome="completed", reply="ok"
        )
        sent = await statements(
            store,
            lambda: store.settle(
                running.fence, settled, outcome="completed", error=None, reply="ok"
            ),
        )
        assert len(sent) == 7, sent
        records = await store.read(conv)
        assert [r.id for r in records[-guests:]] == [f"{g.id}:settled" for g in admitted]
        for guest in admitted:
            row = await store.get_submission(guest.id)
            assert row is not None and (row.outcome, row.reply) == ("completed", "ok")
    finally:
        await store.close()


def named(name: str, submission_id: str) -> Any:
    from hearth.records import UserMessage

    return UserMessage(id=name, message_id=name, content="x", submission_id=submission_id)


@asynccontextmanager
async def two_processes_and_a_host(pg_cluster: Any) -> AsyncIterator[tuple[Any, Any, Any, Any]]:
    """Two stores on one schema (two processes); the first claimed a host in ``support/c-1``
    that appended once (``h1``), so it knows the conversation's tail. Yields both stores, the
    host's row as claimed, and a ``NewSubmission`` to queue behind it."""
    from pgcluster import new_schema

    from hearth.store.postgres import PostgresStore

    schema = new_schema()
    mine, other = (PostgresStore(pg_cluster.conninfo, schema=schema) for _ in range(2))
    await mine.open()
    await other.open()
    try:
        new = NewSubmission("support/c-1", "support", "message", {"message": "hi"})
        host = (await mine.admit(new)).submission
        [running] = await mine.claim("owner-1", 30.0, 1)
        assert await mine.append(new.conversation_id, [named("h1", host.id)], fence=running.fence)
        yield mine, other, running, new
    finally:
        await mine.close()
        await other.close()


async def test_a_join_after_another_writer_moved_the_offset_lands_the_general_way(
    pg_cluster: Any,
) -> None:
    async with two_processes_and_a_host(pg_cluster) as (mine, other, running, new):
        conv = new.conversation_id
        guest = (await mine.admit(new)).submission
        await other.append(conv, [named("x", running.id)])  # the offset mine knows is stale now
        sent = await statements(
            mine, lambda: mine.join(running.fence, guest.id, [named("g", guest.id)])
        )
        assert len(sent) > 2, sent  # the fast append found the offset moved
        step = await statements(
            mine, lambda: mine.append(conv, [named("h2", running.id)], fence=running.fence)
        )
        assert len(step) == 1, step  # the join left the tail it wrote
        records = await other.read(conv)
        assert [(r.offset, r.id) for r in records[1:]] == [(1, "h1"), (2, "x"), (3, "g"), (4, "h2")]
        row = await other.get_submission(guest.id)
        assert row is not None and (row.status, row.joined_to) == ("joined", running.id)


async def test_several_joins_are_one_round_trip_on_postgres_and_keep_their_order(
    pg_cluster: Any,
) -> None:
    """Messages queued behind a running host join it in one query once the host has appended.
    When another writer moved the offset by exactly one meanwhile, the first join of the query
    cannot land and neither can any after it (each needs the one before it joined), so none
    ever joins ahead of an earlier one; the general path then joins them in order."""
    async with two_processes_and_a_host(pg_cluster) as (mine, other, running, new):
        conv = new.conversation_id
        guests = [(await mine.admit(new)).submission for _ in range(5)]
        joins = [(g.id, [named(f"g{n}", g.id)]) for n, g in enumerate(guests)]
        joined: list[int] = []

        async def join(part: list[Any]) -> None:
            joined.append(await mine.join_many(running.fence, part))

        sent = await statements(mine, lambda: join(joins[:3]))
        assert joined == [3] and len(sent) == 1, sent
        await other.append(conv, [named("x", running.id)])  # mine's tail is one behind now
        sent = await statements(mine, lambda: join(joins[3:]))
        assert joined == [3, 2] and len(sent) > 1, sent
        records = await other.read(conv)
        expected = ["h1", "g0", "g1", "g2", "x", "g3", "g4"]
        assert [(r.offset, r.id) for r in records[1:]] == list(enumerate(expected, start=1))
        for guest in guests:
            row = await other.get_submission(guest.id)
            assert row is not None and (row.status, row.joined_to) == ("joined", running.id)


async def test_a_turn_view_is_one_round_trip_on_postgres(pg_cluster: Any) -> None:
    from pgcluster import new_schema

    from hearth.store.postgres import PostgresStore

    store = PostgresStore(pg_cluster.conninfo, schema=new_schema())
    await store.open()
    try:
        sub = (await store.admit(NewSubmission("support/c-1", "support", "message", {}))).submission
        sent = await statements(store, lambda: store.turn_view("support/c-1", -1, sub.id))
        assert len(sent) == 1, sent
    finally:
        await store.close()
