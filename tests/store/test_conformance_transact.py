"""``Store.transact``: the application's work and hearth's records in one transaction
(PostgreSQL), or a ``ConfigurationError`` naming PostgreSQL before anything runs (SQLite)."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import psycopg
import pytest
from test_conformance import CONV, running

from hearth.errors import ConfigurationError, FencedOut, IntegrityError
from hearth.records import Record, ToolStepSettled
from hearth.store import Store
from hearth.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


def step(sub_id: str, attempt: int, name: str = "book", value: Any = 1) -> ToolStepSettled:
    return ToolStepSettled(
        id=f"m:step:t1:{name}", tool_call_id="t1", step=name, value=value
    ).stamped(sub_id, attempt)


class App:
    """An application table in the database's own schema (not hearth's)."""

    def __init__(self, store: Store) -> None:
        self.conninfo = getattr(store, "conninfo", "")
        self.table = f"app_{uuid.uuid4().hex[:10]}"
        self.ran = 0

    async def create(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            await conn.execute(f"CREATE TABLE {self.table} (k text, seen_path text)")

    async def rows(self) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            cursor = await conn.execute(f"SELECT k, seen_path FROM {self.table}")
            return await cursor.fetchall()

    async def insert(self, conn: Any) -> str:
        self.ran += 1
        path = (await (await conn.execute("SHOW search_path")).fetchone())[0]
        await conn.execute(f"INSERT INTO {self.table} (k, seen_path) VALUES ('x', %s)", (path,))
        return "booked"


# SQLite has no transaction to share with the application: it has its own case, and the others
# run on PostgreSQL only (chosen here, rather than skipped).
ON_POSTGRES = pytest.mark.parametrize("store", ["postgres"], indirect=True)
ON_SQLITE = pytest.mark.parametrize("store", ["sqlite-file", "sqlite-memory"], indirect=True)


@ON_SQLITE
async def test_sqlite_refuses_naming_postgresql_and_runs_nothing(store: Store) -> None:
    assert isinstance(store, SQLiteStore)
    sub = await running(store)
    ran = []

    async def work(conn: Any) -> None:
        ran.append(conn)

    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        await store.transact(CONV, sub.fence, work, lambda v: [step(sub.id, 1)], ids=["x"])
    assert ran == []


@ON_POSTGRES
async def test_the_work_and_the_record_commit_together(store: Store) -> None:
    app = App(store)
    await app.create()
    sub = await running(store)
    before = await store.read(CONV)

    def records(value: Any) -> list[Record]:
        return [step(sub.id, sub.attempt, value=value)]

    stored = await store.transact(CONV, sub.fence, app.insert, records, ids=["m:step:t1:book"])
    assert [(r.id, r.offset) for r in stored] == [("m:step:t1:book", before[-1].offset + 1)]
    assert isinstance(stored[0], ToolStepSettled) and stored[0].value == "booked"
    assert (await store.read(CONV))[-1] == stored[0]
    rows = await app.rows()
    assert len(rows) == 1
    assert "hearth" not in rows[0][1] and getattr(store, "schema", "") not in rows[0][1]


@ON_POSTGRES
async def test_a_raising_work_rolls_both_back_and_raises_as_it_is(store: Store) -> None:
    app = App(store)
    await app.create()
    sub = await running(store)
    before = await store.read(CONV)

    async def work(conn: Any) -> None:
        await app.insert(conn)
        raise LookupError("no such seat")

    with pytest.raises(LookupError, match="no such seat"):
        await store.transact(
            CONV, sub.fence, work, lambda v: [step(sub.id, sub.attempt)], ids=["m:step:t1:book"]
        )
    assert await app.rows() == []
    assert await store.read(CONV) == before


@ON_POSTGRES
async def test_an_application_sql_error_reaches_the_caller_unchanged(store: Store) -> None:
    sub = await running(store)

    async def work(conn: Any) -> None:
        await conn.execute("SELECT * FROM no_such_table_here")

    with pytest.raises(psycopg.errors.UndefinedTable):
        await store.transact(
            CONV, sub.fence, work, lambda v: [step(sub.id, sub.attempt)], ids=["m:step:t1:book"]
        )


@pytest.mark.parametrize("store_pair", ["postgres"], indirect=True)
async def test_a_stale_attempt_is_fenced_out_before_its_work_runs(
    store_pair: tuple[Store, Store],
) -> None:
    first, second = store_pair
    app = App(first)
    await app.create()
    sub = await running(first)
    await first.expire_owners(["owner-1"])
    (again,) = await second.claim("owner-2", 30.0, 10)
    assert again.attempt == sub.attempt + 1
    with pytest.raises(FencedOut):
        await first.transact(
            CONV, sub.fence, app.insert, lambda v: [step(sub.id, sub.attempt)], ids=["x"]
        )
    assert app.ran == 0 and await app.rows() == []


@pytest.mark.parametrize("store_pair", ["postgres"], indirect=True)
async def test_a_lost_try_does_not_take_the_next_attempts_records_for_its_own_commit(
    store_pair: tuple[Store, Store],
) -> None:
    """A stale attempt's transaction is lost (the database restarted under it) while a peer
    takes the work over and commits the same step (its id is the same in every attempt): the
    stale attempt's retry read the peer's record back as its own commit, returned its value and
    ran its next steps again. It is fenced out instead."""
    first, second = store_pair
    app = App(first)
    await app.create()
    sub = await running(first)
    done = step(sub.id, sub.attempt + 1, value="the peer's")
    tries = 0

    async def lost_while_the_peer_takes_over(conn: Any) -> str:
        nonlocal tries
        tries += 1
        if tries == 1:
            pid = conn.info.backend_pid  # (its transaction holds the row: ended first)
            async with await psycopg.AsyncConnection.connect(
                app.conninfo, autocommit=True
            ) as admin:
                await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
            await first.expire_owners(["owner-1"])
            (again,) = await second.claim("owner-2", 30.0, 10)
            await second.transact(CONV, again.fence, app.insert, lambda v: [done], ids=[done.id])
            await conn.execute("SELECT 1")  # the connection is gone: the store tries again
        return await app.insert(conn)

    with pytest.raises(FencedOut):
        await first.transact(
            CONV,
            sub.fence,
            lost_while_the_peer_takes_over,
            lambda v: [step(sub.id, sub.attempt, value=v)],
            ids=[done.id],
        )
    assert app.ran == 1  # the peer's insert only
    [stored] = [r for r in await first.read(CONV) if r.id == done.id]
    assert stored.attempt == sub.attempt + 1


@ON_POSTGRES
async def test_a_record_that_exists_fails_the_transaction_instead_of_a_no_op(store: Store) -> None:
    app = App(store)
    await app.create()
    sub = await running(store)
    done = step(sub.id, sub.attempt, value="booked")
    await store.append(CONV, [done], fence=sub.fence)
    with pytest.raises(IntegrityError):
        await store.transact(CONV, sub.fence, app.insert, lambda v: [done], ids=[done.id])
    assert app.ran == 1 and await app.rows() == []  # its write rolled back with the insert


@ON_POSTGRES
async def test_what_the_work_sets_for_the_session_does_not_outlive_the_transaction(
    store: Store,
) -> None:
    """A plain ``SET search_path`` (not ``SET LOCAL``) in the work outlived the commit on the
    pooled connection: every later use of it failed ("relation ... does not exist")."""
    sub = await running(store)

    async def work(conn: Any) -> str:
        await conn.execute("SET search_path TO pg_catalog")
        await conn.execute("SET statement_timeout TO 1")
        return "set"

    await store.transact(
        CONV, sub.fence, work, lambda v: [step(sub.id, sub.attempt)], ids=["m:step:t1:book"]
    )
    pool = store._transactions.pool  # type: ignore[attr-defined]
    async with contextlib.AsyncExitStack() as held:  # every connection of the pool, at once
        conns = [await held.enter_async_context(pool.connection()) for _ in range(pool.max_size)]
        for conn in conns:
            cur = await conn.execute(
                "SELECT current_setting('search_path') AS p,"
                " current_setting('statement_timeout') AS t"
            )
            row = await cur.fetchone()
            assert (row["p"], row["t"]) == (store.schema, "0")  # type: ignore[attr-defined]
    assert len(await store.read(CONV)) > 0
