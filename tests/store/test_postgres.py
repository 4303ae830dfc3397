"""Behaviour of the PostgreSQL store beyond the store contract: URLs, migrations, offsets under
concurrent writers, the listener, and writes whose commit outcome was lost."""

from __future__ import annotations

import asyncio
import contextlib
import random
import string
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgcluster import Cluster, free_port, new_schema
from pgproxy import PgProxy

import hearth.store
from hearth.errors import (
    ConfigurationError,
    FencedOut,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
)
from hearth.records import ToolStepSettled, UserMessage
from hearth.store import NewSubmission, open_store, rules
from hearth.store import postgres_ops as ops
from hearth.store.postgres import PostgresStore
from hearth.store.postgres_schema import SCHEMA_VERSION, migrate
from hearth.store.rules import settlement
from hearth.testing.clock import ManualClock

pytestmark = pytest.mark.anyio

SRC = str(Path(hearth.store.__file__).resolve().parents[2])
CONV = "support/c-1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def msg(n: int, submission_id: str | None = None) -> UserMessage:
    return UserMessage(
        id=f"m{n}", message_id=f"m{n}", content=f"text {n}", submission_id=submission_id
    )


@contextlib.asynccontextmanager
async def opened(conninfo: str, schema: str, **options: object) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(conninfo, schema=schema, **options)  # type: ignore[arg-type]
    await store.open()
    try:
        yield store
    finally:
        await store.close()


# --- URLs ------------------------------------------------------------------------------------


def test_a_url_of_several_hosts_is_named_host_by_host() -> None:
    """Each host with its port (it read ``127.0.0.1,127.0.0.1:54361,54362``)."""
    two = open_store("postgresql://u@db1:5433,db2:5434/app?target_session_attrs=read-write")
    assert isinstance(two, PostgresStore)
    assert two.where == "PostgreSQL at db1:5433,db2:5434/app"
    alike = open_store("postgresql://u@db1,db2/app")
    assert isinstance(alike, PostgresStore)
    assert alike.where == "PostgreSQL at db1:5432,db2:5432/app"


def test_postgres_urls_open_a_postgres_store_with_its_schema() -> None:
    store = open_store("postgresql://u:secret@db.example:6543/app?schema=tenant_7&sslmode=disable")
    assert isinstance(store, PostgresStore)
    assert store.schema == "tenant_7"
    assert "schema" not in store.conninfo and "sslmode=disable" in store.conninfo
    assert store.where == "PostgreSQL at db.example:6543/app"
    default = open_store("postgres://localhost/app", pg_pool=3)
    assert isinstance(default, PostgresStore)
    assert (default.schema, default.pool_size) == ("hearth", 3)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://localhost/app?schema=",
        "postgresql://localhost/app?schema=1bad-name",
        # Upper case was created quoted and searched folded: migrate reported it current, then
        # the store found no tables (or another deployment's lower-case ones).
        "postgresql://localhost/app?schema=Tenant_x",
    ],
)
def test_a_bad_schema_name_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="schema"):
        open_store(url)


@pytest.mark.parametrize("url", ["postgresql://u:secret@db:notaport/app", "postgresql://[::1/app"])
def test_a_malformed_postgres_url_is_a_configuration_error_without_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError, match="bad PostgreSQL URL") as caught:
        open_store(url)
    assert "secret" not in str(caught.value)


async def test_a_connection_string_the_driver_rejects_is_a_configuration_error(
    pg_cluster: Cluster,
) -> None:
    store = PostgresStore(f"{pg_cluster.conninfo}?sslmod=require")  # a misspelt option
    with pytest.raises(ConfigurationError, match="bad PostgreSQL URL"):
        await store.open()


async def test_the_urls_own_options_and_spaces_reach_the_server(pg_cluster: Cluster) -> None:
    """Spaces went as "+" (libpq read "billing+worker"), and hearth's own ``options`` replaced
    the URL's (a statement_timeout given there was lost)."""
    query = "application_name=billing%20worker&options=-c%20statement_timeout%3D4321"
    store = open_store(f"{pg_cluster.conninfo}?{query}&schema={new_schema()}")
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        assert store._transactions is not None
        async with store._transactions.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT current_setting('application_name') AS a,"
                " current_setting('statement_timeout') AS t, current_setting('search_path') AS p"
            )
            row = await cur.fetchone()
            assert row is not None
            assert (row["a"], row["t"], row["p"]) == ("billing worker", "4321ms", store.schema)
    finally:
        await store.close()


async def test_a_role_that_owns_its_schema_needs_no_create_on_the_database(
    pg_cluster: Cluster,
) -> None:
    """``CREATE SCHEMA IF NOT EXISTS`` asks for the database's CREATE privilege even when the
    schema exists: a role given only its own schema could not open the store."""
    schema, role = new_schema(), f"r_{uuid.uuid4().hex[:12]}"
    pg_cluster.sql(f"CREATE ROLE {role} LOGIN; CREATE SCHEMA {schema} AUTHORIZATION {role}")
    try:
        conninfo = pg_cluster.conninfo.replace("postgres@", f"{role}@", 1)
        async with opened(conninfo, schema) as store:
            await store.admit(NewSubmission("a/c", "a", "message", {"message": "hi"}))
    finally:
        pg_cluster.sql(f"DROP SCHEMA {schema} CASCADE; DROP ROLE {role}")


async def test_ping_answers_while_the_server_is_up(pg_cluster: Cluster) -> None:
    async with opened(pg_cluster.conninfo, new_schema()) as store:
        await store.ping(2.0)


def test_without_the_extra_a_postgres_url_names_the_install_command() -> None:
    script = (
        "import sys\n"
        "sys.modules['psycopg'] = None\n"  # as if hearth[postgres] were not installed
        "from hearth.errors import ConfigurationError\n"
        "from hearth.store import open_store\n"
        "try:\n"
        "    open_store('postgresql://localhost/app')\n"
        "except ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={"PYTHONPATH": SRC}
    )
    assert "pip install 'hearth[postgres]'" in out.stdout, out.stderr


async def test_an_unreachable_server_is_one_clear_error() -> None:
    store = PostgresStore(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    with pytest.raises(StoreUnavailable, match=r"cannot connect to PostgreSQL at 127\.0\.0\.1:"):
        await store.open()


async def test_an_admission_waits_for_a_busy_pool_instead_of_calling_the_server_unreachable(
    pg_cluster: Cluster,
) -> None:
    """A burst that keeps every connection busy for longer than admission's 1.5 s budget, while
    the server goes on answering, is not an outage: the admission queues and is admitted."""
    async with opened(pg_cluster.conninfo, new_schema(), pool_size=2) as store:
        pool = store._tx().pool
        stop = asyncio.Event()
        done = 0

        async def burst() -> None:  # 100 callers, 50 ms each, on 2 connections: ~2.5 s deep
            nonlocal done
            while not stop.is_set():
                async with pool.connection(timeout=60) as conn:
                    await conn.execute("SELECT pg_sleep(0.05)")
                done += 1
                store._tx().progressed()

        callers = [asyncio.create_task(burst()) for _ in range(100)]
        while done < 10:
            await asyncio.sleep(0.01)
        try:
            admission = await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
            assert admission.submission.conversation_id == CONV
        finally:
            stop.set()
            await asyncio.gather(*callers)


async def test_an_admission_gives_up_quickly_when_connections_are_stuck_and_nothing_answers(
    pg_cluster: Cluster,
) -> None:
    """Every connection in use and the server no longer answering (not even a new connection):
    the 1.5 s budget holds and the error names the server. (It took twice the budget: whether
    the server answered was asked only once the wait for a connection had ended.) And the
    store closes at once: cancelled, the listener's statement waited 10 s for a cancel request
    on a server that did not answer."""
    async with frozen_server(pg_cluster) as (store, freeze):
        await freeze()
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match="is unreachable"):
            await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        assert time.monotonic() - began < 2.5  # (3.0 s when asked after the wait)
        with pytest.raises(StoreUnavailable):
            await store.ping(1.5)
        closing = time.monotonic()
    assert time.monotonic() - closing < 5.0  # (10 s while the listener was cancelled)


async def test_connections_held_by_long_transactions_are_a_busy_pool_not_an_outage(
    pg_cluster: Cluster,
) -> None:
    """Every connection held by the application's long transactions, nothing finished for
    longer than admission's budget, while the server answers: ``ping`` (what /healthz asks)
    passes, and an admission queues until a connection is free instead of saying the server is
    unreachable."""
    async with opened(pg_cluster.conninfo, new_schema(), pool_size=2) as store:
        pool = store._tx().pool
        release = asyncio.Event()

        async def held() -> None:  # an application's step.transaction, say
            async with pool.connection() as conn:
                await release.wait()
                await conn.execute("SELECT 1")

        holders = [asyncio.create_task(held()) for _ in range(2)]
        await asyncio.sleep(1.6)
        try:
            await store.ping(1.5)
            admitting = asyncio.create_task(
                store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
            )
            await asyncio.sleep(2.0)  # longer than the admission's own budget
            assert not admitting.done()
            release.set()
            admission = await asyncio.wait_for(admitting, 10)
            assert admission.submission.conversation_id == CONV
        finally:
            release.set()
            await asyncio.gather(*holders)


@contextlib.asynccontextmanager
async def frozen_server(
    pg_cluster: Cluster,
) -> AsyncIterator[tuple[PostgresStore, Callable[[], Awaitable[None]]]]:
    """A store (pool of 2) reaching the server through a proxy, and the call that
    freezes it with both connections of the pool in use: then nothing is finished for longer
    than an admission's budget, and the server seems to have stopped answering."""
    proxy = PgProxy(pg_cluster.port)
    await proxy.start()
    conninfo = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    release = asyncio.Event()
    holders: list[asyncio.Task[None]] = []
    try:
        async with opened(conninfo, new_schema(), pool_size=2) as store:
            pool = store._tx().pool

            async def stuck() -> None:
                async with pool.connection():
                    await release.wait()

            async def freeze() -> None:
                holders.extend(asyncio.create_task(stuck()) for _ in range(2))
                while pool.get_stats().get("pool_available", 0) or len(holders) < 2:
                    await asyncio.sleep(0.05)
                proxy.freeze()
                await asyncio.sleep(1.6)

            yield store, freeze
    finally:
        release.set()
        await asyncio.gather(*holders, return_exceptions=True)
        await proxy.stop()


@pytest.mark.parametrize("operation", ["fork", "abort", "resolve"])
async def test_what_a_caller_asks_for_gives_up_as_an_admission_does(
    pg_cluster: Cluster, operation: str
) -> None:
    """A fork, an abort or a wait's resolve while the server did not answer took the whole
    write budget (30 s) before the HTTP answer said 503."""
    async with frozen_server(pg_cluster) as (store, freeze):
        store.write_retry_s = 3600.0  # the fenced writes' budget: the call must not wait it out
        await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        calls = {
            "fork": lambda: store.fork(CONV, 0, "support/forked"),
            "abort": lambda: store.request_abort(CONV),
            "resolve": lambda: store.resolve_wait(CONV, "w_1", True),
        }
        await freeze()
        with pytest.raises(StoreUnavailable, match="is unreachable"):
            await asyncio.wait_for(calls[operation](), 120)


async def test_an_abort_locks_a_conversations_rows_in_admission_order(pg_cluster: Cluster) -> None:
    """A settlement locks its row, then the next one's; an abort locked all of them in index
    order (by status: the queued row before the running one), so the two could deadlock (one
    then answered 503 "unreachable")."""
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        later = (await store.admit(NewSubmission(CONV, "support", "message", {"t": 2}))).submission
        (running,) = await store.claim("owner-1", 30.0, 1)
        rows = f"{schema}.submissions"
        async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as side:
            await side.execute(f"SELECT 1 FROM {rows} WHERE id = %s FOR UPDATE", (running.id,))
            aborting = asyncio.create_task(store.request_abort(CONV))
            await asyncio.sleep(0.5)
            # As the settlement of the running one would: the next row next. It is free, not
            # held by the abort waiting for the first.
            await side.execute(f"SELECT 1 FROM {rows} WHERE id = %s FOR UPDATE NOWAIT", (later.id,))
            await side.commit()
        assert await asyncio.wait_for(aborting, 20) == [running.id, later.id]


# --- migrations ------------------------------------------------------------------------------


async def test_many_stores_opening_at_once_create_the_schema_once(pg_cluster: Cluster) -> None:
    schema = new_schema()
    stores = [PostgresStore(pg_cluster.conninfo, schema=schema, pool_size=1) for _ in range(6)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        admission = await stores[3].admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        assert (await stores[0].get_submission(admission.submission.id)) is not None
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    version = pg_cluster.sql(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
    assert version == str(SCHEMA_VERSION)


async def test_the_first_releases_version_1_without_heads_is_migrated(pg_cluster: Cluster) -> None:
    """The first release's version 1 had no ``submissions.is_head`` (a later one added it under
    the same number): its migration failed, 'column "is_head" does not exist', for good, with
    its queued and running work stuck."""
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        first = (await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))).submission
        await store.admit(NewSubmission(CONV, "support", "message", {"t": 2}))
        other = await store.admit(NewSubmission("support/c-2", "support", "message", {"t": 3}))
    pg_cluster.sql(
        f"ALTER TABLE {schema}.submissions DROP COLUMN is_head CASCADE;"
        f" UPDATE {schema}.meta SET value = '1' WHERE key = 'schema_version'"
    )
    async with opened(pg_cluster.conninfo, schema) as store:
        claimed = await store.claim("owner-1", 30.0, 10)
        # Each conversation's oldest, as before: one at a time, in admission order.
        assert [c.id for c in claimed] == [first.id, other.submission.id]
    found = pg_cluster.sql(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
    assert found == str(SCHEMA_VERSION)


def _as_version_8(pg_cluster: Cluster, schema: str) -> None:
    """The submissions table as version 8 left it: no count of graceful releases (nor the
    carried writes of version 11)."""
    pg_cluster.sql(
        f"ALTER TABLE {schema}.submissions DROP COLUMN releases;"
        f" ALTER TABLE {schema}.submissions DROP COLUMN carried;"
        f" UPDATE {schema}.meta SET value = '8' WHERE key = 'schema_version'"
    )


async def test_a_version_8_schema_counts_graceful_releases_after_its_migration(
    pg_cluster: Cluster,
) -> None:
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        first = (await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))).submission
    _as_version_8(pg_cluster, schema)
    async with opened(pg_cluster.conninfo, schema) as store:
        assert await store.get_submission(first.id) == first  # releases 0
        (claimed,) = await store.claim("owner-1", 30.0, 1)
        assert await store.release(claimed.fence, "owner-1", graceful=True)
        row = await store.get_submission(first.id)
        assert row is not None and (row.attempt, row.releases, row.interruptions) == (1, 1, 0)
    found = pg_cluster.sql(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
    assert found == str(SCHEMA_VERSION) == "11"


def _as_version_7(pg_cluster: Cluster, schema: str) -> None:
    """The conversations table as version 7 left it: the list's indexes on last_activity."""
    _as_version_8(pg_cluster, schema)
    pg_cluster.sql(
        f"ALTER TABLE {schema}.conversations DROP COLUMN activity_bucket;"
        f" CREATE INDEX conversations_by_activity ON {schema}.conversations"
        " (last_activity, conversation_id);"
        f" CREATE INDEX conversations_by_agent ON {schema}.conversations"
        " (agent, last_activity, conversation_id);"
        f" UPDATE {schema}.meta SET value = '7' WHERE key = 'schema_version'"
    )


async def test_a_version_7_schema_lists_through_activity_buckets_after_its_migration(
    pg_cluster: Cluster, clock: ManualClock
) -> None:
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema, clock=clock) as store:
        for n, at in enumerate([1000.0, 1009.5, 1010.0, 2000.25]):
            clock.set(at)
            await store.admit(NewSubmission(f"support/c-{n}", "support", "message", {"n": n}))
    _as_version_7(pg_cluster, schema)
    async with opened(pg_cluster.conninfo, schema, clock=clock) as store:
        page = await store.list_conversations(before=(2000.25, "support/c-3"), limit=2)
        assert [c.conversation_id for c in page] == ["support/c-2", "support/c-1"]
        clock.set(3000.0)
        await store.append("support/c-0", [msg(1)])  # moves it to a new bucket
        listed = await store.list_conversations()
        assert [c.conversation_id for c in listed] == [f"support/c-{n}" for n in (0, 3, 2, 1)]
    buckets = pg_cluster.sql(
        f"SELECT string_agg(conversation_id || '=' || activity_bucket, ',' ORDER BY"
        f" conversation_id) FROM {schema}.conversations"
    )
    assert buckets == "support/c-0=300,support/c-1=100,support/c-2=101,support/c-3=200"
    indexes = pg_cluster.sql(
        f"SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes"
        f" WHERE schemaname = '{schema}' AND tablename = 'conversations'"
    )
    assert indexes == "conversations_pkey,conversations_recent,conversations_recent_by_agent"


async def test_a_version_1_schema_is_migrated_with_the_last_activity_of_its_conversations(
    pg_cluster: Cluster,
) -> None:
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        await store.admit(NewSubmission("support/old", "support", "message", {"t": 1}))
        await store.admit(NewSubmission("support/new", "support", "message", {"t": 2}))
    _as_version_7(pg_cluster, schema)
    pg_cluster.sql(  # as version 1 left it
        f"DROP INDEX {schema}.conversations_by_activity;"
        f" DROP INDEX {schema}.conversations_by_agent;"
        f" ALTER TABLE {schema}.conversations DROP COLUMN last_activity;"
        f" UPDATE {schema}.submissions SET accepted_at = 5e9"
        " WHERE conversation_id = 'support/old';"
        f" UPDATE {schema}.meta SET value = '1' WHERE key = 'schema_version'"
    )
    async with opened(pg_cluster.conninfo, schema) as store:
        listed = await store.list_conversations()
        assert [(c.conversation_id, c.last_activity) for c in listed[:1]] == [("support/old", 5e9)]
        assert [c.conversation_id for c in listed] == ["support/old", "support/new"]
    found = pg_cluster.sql(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
    assert found == str(SCHEMA_VERSION)


async def test_opening_a_current_schema_takes_no_table_lock(pg_cluster: Cluster) -> None:
    """A process starting while a peer writes must not queue DDL behind the peer's locks: two
    servers starting at once deadlocked there before (found by the PostgreSQL soak)."""
    import psycopg

    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema):
        pass
    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as busy:
        await busy.execute(f"LOCK TABLE {schema}.submissions IN ROW EXCLUSIVE MODE")  # a writer
        async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as starting:
            await starting.execute("SET lock_timeout = '3s'")
            await migrate(starting, schema)  # without the early return: LockNotAvailable
        await busy.rollback()


async def test_a_schema_made_by_a_newer_hearth_is_refused(pg_cluster: Cluster) -> None:
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema):
        pass
    pg_cluster.sql(f"UPDATE {schema}.meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(
        SchemaTooNew, match=rf"schema version 99; this hearth knows version {SCHEMA_VERSION}"
    ):
        await PostgresStore(pg_cluster.conninfo, schema=schema).open()


async def test_a_page_of_100000_conversations_is_read_through_an_index(
    pg_cluster: Cluster,
) -> None:
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema):
        pass
    pg_cluster.sql(
        f"INSERT INTO {schema}.conversations (conversation_id, agent, parent, last_offset,"
        " created_at, last_activity) SELECT (CASE WHEN n % 2 = 0 THEN 'a' ELSE 'b' END)"
        " || '/c-' || n, CASE WHEN n % 2 = 0 THEN 'a' ELSE 'b' END, NULL, 0, n, n"
        f" FROM generate_series(0, 99999) AS n; ANALYZE {schema}.conversations"
    )
    for agent in (False, True):
        for before in (False, True):
            sql = rules.conversation_list_sql(agent, None, before, lambda n: f"%({n})s")
            text = sql % {
                "agent": "'a'",
                "b": "5000",
                "t": "50000",
                "c": "'a/c-50000'",
                "limit": "51",
            }
            plan = pg_cluster.sql(f"SET search_path TO {schema}; EXPLAIN {text}")
            assert "Index Scan" in plan and "conversations_recent" in plan, plan
            # Only the rows of the buckets a page reaches are sorted, never all rows.
            sorts = [line for line in plan.splitlines() if "Sort " in line and "Key" not in line]
            assert sorts and all("Incremental Sort" in line for line in sorts), plan
            assert "Seq Scan on conversations" not in plan, plan
    async with opened(pg_cluster.conninfo, schema) as store:
        page = await store.list_conversations("b", before=(60001.0, "b/c-60001"), limit=3)
        assert [c.conversation_id for c in page] == ["b/c-59999", "b/c-59997", "b/c-59995"]


async def test_a_claim_reads_only_heads_that_may_run_not_waiting_ones(pg_cluster: Cluster) -> None:
    """Waiting heads (a person's answer may take days) stayed in the index a claim reads, and
    each claim filtered all of them out: 10,000 waiting conversations made every claim, and
    every write behind it, slower."""
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        for n in range(300):
            await store.admit(NewSubmission(f"support/w-{n}", "support", "message", {"t": n}))
        pg_cluster.sql(
            f"UPDATE {schema}.submissions SET status = 'waiting'; ANALYZE {schema}.submissions"
        )
        await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        params = {
            "owner": "o",
            "lease_s": 30.0,
            "limit": 10,
            "excluded": [],
            "agents": None,
            "others_after": 0.0,
            "aborting_only": False,
            "token": "t",
            "now": None,
        }
        plan = ""
        async with store._tx().connection(5) as conn:
            with contextlib.suppress(LookupError):
                async with conn.transaction():  # rolled back: nothing claimed for good
                    explain = "EXPLAIN (ANALYZE, COSTS OFF) " + ops.CLAIM
                    cursor = await conn.execute(explain.encode(), params)
                    plan = "\n".join(str(row["QUERY PLAN"]) for row in await cursor.fetchall())
                    raise LookupError("roll back")
        assert "submissions_claimable" in plan, plan
        assert "Rows Removed by Filter: 300" not in plan, plan
        (claimed,) = await store.claim("owner-1", 30.0, 10)
        assert claimed.conversation_id == CONV


async def test_a_version_1_schema_gains_sources_deliveries_and_schedules(
    pg_cluster: Cluster,
) -> None:
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        old = (await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))).submission
    pg_cluster.sql(  # as version 1 left it
        f"ALTER TABLE {schema}.submissions DROP COLUMN source;"
        f" DROP TABLE {schema}.deliveries; DROP TABLE {schema}.schedules;"
        f" UPDATE {schema}.meta SET value = '1' WHERE key = 'schema_version'"
    )
    async with opened(pg_cluster.conninfo, schema) as store:
        assert await store.get_submission(old.id) == old
        assert (await store.open_schedule("daily", "0 9 * * *|UTC", 10.0)).cursor == 10.0
        assert await store.list_deliveries("hooks") == []


async def test_a_version_3_schema_gets_the_traceparent_column(pg_cluster: Cluster) -> None:
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        old = (await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))).submission
    pg_cluster.sql(f"ALTER TABLE {schema}.submissions DROP COLUMN traceparent")
    pg_cluster.sql(f"UPDATE {schema}.meta SET value = '3' WHERE key = 'schema_version'")
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with opened(pg_cluster.conninfo, schema) as store:
        assert (await store.get_submission(old.id)).traceparent is None  # type: ignore[union-attr]
        fresh = NewSubmission("support/c-9", "support", "message", {"t": 2}, traceparent=parent)
        sid = (await store.admit(fresh)).submission.id
        assert (await store.get_submission(sid)).traceparent == parent  # type: ignore[union-attr]


async def test_a_version_4_schema_is_upgraded_with_the_columns_of_durable_waits(
    pg_cluster: Cluster,
) -> None:
    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        sid = (await store.admit(NewSubmission("support/c-1", "support", "message", {}))).submission
    pg_cluster.sql(  # as version 4 left it: no waits
        f"DROP TABLE {schema}.waits; ALTER TABLE {schema}.submissions DROP COLUMN waits,"
        f" DROP COLUMN waiting_since; UPDATE {schema}.meta SET value = '4'"
        " WHERE key = 'schema_version'"
    )
    async with opened(pg_cluster.conninfo, schema) as store:
        sub = await store.get_submission(sid.id)
        assert sub is not None and sub.waits == 0 and sub.waiting_since is None
        assert await store.list_waits() == []
    version = pg_cluster.sql(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
    assert version == str(SCHEMA_VERSION)


async def test_a_version_6_schema_gets_the_partial_type_indexes(pg_cluster: Cluster) -> None:
    """Compactions and settlements are looked up through partial indexes of their own (a
    step's record writes one index fewer); a version 6 schema's index over every type goes."""
    from hearth.records import Compaction
    from hearth.store import postgres_ops

    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        await store.append(CONV, [msg(1)])
    pg_cluster.sql(  # as version 6 left it: every record in one type index
        f"DROP INDEX {schema}.records_compactions; DROP INDEX {schema}.records_settlements;"
        f' CREATE INDEX records_by_type ON {schema}.records (conversation_id, type, "offset");'
        f" UPDATE {schema}.meta SET value = '6' WHERE key = 'schema_version'"
    )
    async with opened(pg_cluster.conninfo, schema) as store:
        found = await store.last_of_type(CONV, "user_message")  # a type without an index
        assert found is not None and (found.id, found.offset) == ("m1", 1)
        assert await store.last_of_type(CONV, Compaction.type) is None
    version = pg_cluster.sql(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
    assert version == str(SCHEMA_VERSION) == "11"
    names = pg_cluster.sql(
        f"SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes"
        f" WHERE schemaname = '{schema}' AND tablename = 'records'"
    )
    assert "records_by_type" not in names
    assert "records_compactions" in names and "records_settlements" in names
    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as conn:
        await conn.execute(f'SET search_path TO "{schema}"')
        await conn.execute("SET enable_seqscan = off")  # tiny tables: ask whether it can
        plans = []
        for query in (
            "SELECT body FROM records WHERE conversation_id = %(c)s AND type = 'compaction'"
            ' ORDER BY "offset" DESC LIMIT 1',
            postgres_ops._SETTLEMENTS,
            postgres_ops._SUBMISSION_SPANS,
        ):
            cursor = await conn.execute(f"EXPLAIN {query}".encode(), {"c": CONV})
            plans.append(" ".join(row[0] for row in await cursor.fetchall()))
    assert "records_compactions" in plans[0], plans
    assert all("records_settlements" in plan for plan in plans[1:]), plans


# --- offsets under concurrent writers --------------------------------------------------------

APPENDER = """
import asyncio, sys
from hearth.records import ToolStepSettled, UserMessage
from hearth.store.postgres import PostgresStore

async def main(conninfo, schema, tag, count):
    store = PostgresStore(conninfo, schema=schema)
    await store.open()
    try:
        for n in range(count):
            record = UserMessage(id=f"{tag}-{n}", message_id=f"{tag}-{n}", content=tag)
            await store.append("support/c-1", [record])
    finally:
        await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


async def test_concurrent_appenders_in_two_processes_leave_no_gap_behind_a_tailer(
    pg_cluster: Cluster,
) -> None:
    schema, count = new_schema(), 150
    async with opened(pg_cluster.conninfo, schema) as store:
        await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        writers = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                APPENDER,
                pg_cluster.conninfo,
                schema,
                tag,
                str(count),
                env={"PYTHONPATH": SRC},
            )
            for tag in ("a", "b")
        ]
        seen: list[int] = [0]  # conversation_created is at 0
        while True:
            for record in await store.read(CONV, after=seen[-1]):
                assert record.offset == seen[-1] + 1, f"gap after offset {seen[-1]}"
                seen.append(record.offset)
            if all(w.returncode is not None for w in writers) and len(seen) == 2 * count + 1:
                break
            await asyncio.sleep(0)
            for w in writers:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.wait(), 0.001)
        assert [w.returncode for w in writers] == [0, 0]
        final = await store.read(CONV)
        assert [r.offset for r in final] == seen  # nothing appeared behind the tailer
        assert sorted(r.id for r in final[1:]) == sorted(
            f"{tag}-{n}" for tag in ("a", "b") for n in range(count)
        )


async def test_the_store_clock_never_answers_behind_an_earlier_answer(pg_cluster: Cluster) -> None:
    """Each reading of the server's clock is taken from the middle of its round trip, so a new
    one can be a little behind the last: a deadline judged passed was then not passed."""
    async with opened(pg_cluster.conninfo, new_schema()) as store:
        first = await store.now()
        assert store._skew is not None
        store._skew = (store._skew[0] - 1.0, store._skew[1])  # a reading a second behind
        assert await store.now() >= first


# --- the listener ----------------------------------------------------------------------------


async def test_the_listener_reconnects_after_its_backend_is_terminated(
    pg_cluster: Cluster,
) -> None:
    schema = new_schema()
    async with (
        opened(pg_cluster.conninfo, schema) as one,
        opened(pg_cluster.conninfo, schema) as two,
    ):
        await one.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        pid = two.listener_pid
        assert pid is not None
        pg_cluster.sql(f"SELECT pg_terminate_backend({pid})")
        for _ in range(200):
            if two.listener_pid not in (None, pid):
                break
            await asyncio.sleep(0.05)
        assert two.listener_pid not in (None, pid)
        waiter = asyncio.create_task(two.events.wait(CONV, timeout=5.0))
        await asyncio.sleep(0.05)
        await one.append(CONV, [msg(1)])
        await asyncio.wait_for(waiter, 5.0)


async def test_what_was_appended_while_the_listener_was_away_wakes_its_waiters_at_once(
    pg_cluster: Cluster,
) -> None:
    """Its notice was lost: a follower of the conversation saw the append only at its own next
    look (an SSE channel's, 5 s later)."""
    schema = new_schema()
    async with (
        opened(pg_cluster.conninfo, schema) as one,
        opened(pg_cluster.conninfo, schema) as two,
    ):
        await one.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        listener = two._listener
        assert listener is not None and listener.connected.is_set()
        waiter = asyncio.create_task(two.events.wait(CONV, timeout=30.0))
        pg_cluster.sql(f"SELECT pg_terminate_backend({two.listener_pid})")
        for _ in range(200):
            if not listener.connected.is_set():
                break
            await asyncio.sleep(0.005)
        await one.append(CONV, [msg(1)])  # while nobody listens for two
        await asyncio.wait_for(waiter, 4.0)


# --- a lost COMMIT reply ---------------------------------------------------------------------


class CommitCutter(PgProxy):
    """A proxy that, once armed, forwards the next ``COMMIT`` and then cuts that connection
    before the server's reply can return."""

    def __init__(self, upstream_port: int, marker: bytes = b"COMMIT") -> None:
        super().__init__(upstream_port)
        self.marker = marker
        self.armed = False
        self.cuts = 0

    async def _link(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        cut = asyncio.Event()

        async def upward() -> None:
            while data := await reader.read(65536):
                committing = self.armed and self.marker in data
                if committing:
                    self.armed = False
                    self.cuts += 1
                    cut.set()  # from now on nothing the server says reaches the client
                up_writer.write(data)
                await up_writer.drain()
                if committing:
                    await asyncio.sleep(0.3)  # the server commits; its answer never returns
                    return

        async def downward() -> None:
            while not cut.is_set() and (data := await up_reader.read(65536)):
                if cut.is_set():
                    return
                writer.write(data)
                await writer.drain()

        await self._until_one_ends([upward(), downward()], writer, up_writer)


async def test_an_append_whose_commit_reply_was_lost_is_read_back_not_written_twice(
    pg_cluster: Cluster,
) -> None:
    proxy = CommitCutter(pg_cluster.port)
    await proxy.start()
    schema = new_schema()
    conninfo = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    try:
        async with opened(conninfo, schema) as store:
            sub = (
                await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
            ).submission
            [running] = await store.claim("owner-1", 30.0, 1)
            proxy.armed = True
            offsets = await store.append(
                CONV, [msg(1, sub.id), msg(2, sub.id)], fence=running.fence
            )
            assert proxy.cuts == 1
            assert offsets == [1, 2]
            assert [r.id for r in await store.read(CONV)] == [f"{CONV}:created", "m1", "m2"]

            proxy.armed = True
            record = settlement(sub.id, "completed", None, "done")
            at = await store.settle(
                running.fence, record, outcome="completed", error=None, reply="done"
            )
            assert proxy.cuts == 2
            assert at == 3
            row = await store.get_submission(sub.id)
            assert row is not None and (row.status, row.outcome) == ("settled", "completed")
            assert [r.id for r in await store.read(CONV, after=2)] == [f"{sub.id}:settled"]
    finally:
        await proxy.stop()


async def test_a_one_statement_append_whose_reply_was_lost_is_not_written_twice(
    pg_cluster: Cluster,
) -> None:
    proxy = CommitCutter(pg_cluster.port, marker=b"moved AS")  # the one-statement append
    await proxy.start()
    schema = new_schema()
    conninfo = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    try:
        async with opened(conninfo, schema) as store:
            sub = (
                await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
            ).submission
            [running] = await store.claim("owner-1", 30.0, 1)
            assert await store.append(CONV, [msg(1, sub.id)], fence=running.fence) == [1]
            proxy.armed = True
            offsets = await store.append(
                CONV, [msg(2, sub.id), msg(3, sub.id)], fence=running.fence
            )
            assert proxy.cuts == 1
            assert offsets == [2, 3]
            ids = [r.id for r in await store.read(CONV)]
            assert ids == [f"{CONV}:created", "m1", "m2", "m3"]
    finally:
        await proxy.stop()


async def test_a_lost_append_is_not_read_back_as_the_record_of_the_attempt_that_took_over(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append of a step record is lost before its COMMIT (the database restarted) while the
    attempt that took over records the same step with the same value (the digest leaves the
    attempt out): the retry read the other attempt's record back as its own commit, and the
    stale attempt went on to run its next step. It is fenced out."""
    from hearth import _faults
    from hearth.store import postgres_readback

    schema = new_schema()
    async with (
        opened(pg_cluster.conninfo, schema) as store,
        opened(pg_cluster.conninfo, schema) as peer,
    ):
        sub = (await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))).submission
        [running] = await store.claim("owner-1", 30.0, 1)

        def step(attempt: int) -> ToolStepSettled:
            record = ToolStepSettled(id="m1:step:t1:s", tool_call_id="t1", step="s", value=1)
            return record.stamped(sub.id, attempt)

        lost: list[int] = []
        reached, read_back = _faults.reached, postgres_readback.appended_offsets

        def restart_before_the_commit(point: str) -> None:
            reached(point)
            if point == "store:commit-begin" and not lost:
                lost.append(1)
                with psycopg.connect(pg_cluster.conninfo, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE state = 'idle in transaction' AND pid <> pg_backend_pid()"
                    )

        async def the_peer_takes_over_first(*args: Any) -> list[int] | None:
            if len(lost) == 1:
                lost.append(2)
                await peer.expire_owners(["owner-1"])
                [again] = await peer.claim("owner-2", 30.0, 1)
                await peer.append(CONV, [step(again.attempt)], fence=again.fence)
            return await read_back(*args)

        monkeypatch.setattr(_faults, "reached", restart_before_the_commit)
        monkeypatch.setattr(postgres_readback, "appended_offsets", the_peer_takes_over_first)
        store._tails.clear()  # (the general append, in a transaction of its own)
        with pytest.raises(FencedOut):
            await store.append(CONV, [step(running.attempt)], fence=running.fence)
        assert lost == [1, 2]


async def test_an_admission_whose_commit_reply_was_lost_is_read_back(pg_cluster: Cluster) -> None:
    # The first admission of a conversation: its creation, first record, lock and insert go in
    # one round trip (one implicit transaction), whose answer is cut.
    proxy = CommitCutter(pg_cluster.port, marker=b"ON CONFLICT DO NOTHING;")
    await proxy.start()
    schema = new_schema()
    conninfo = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    try:
        async with opened(conninfo, schema) as store:
            proxy.armed = True
            admission = await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
            assert proxy.cuts == 1
            listed = await store.list_submissions(CONV)
            assert [s.id for s in listed] == [admission.submission.id]
            assert [r.id for r in await store.read(CONV)] == [f"{CONV}:created"]
    finally:
        await proxy.stop()


@contextlib.asynccontextmanager
async def behind_a_cutter(
    pg_cluster: Cluster, marker: bytes
) -> AsyncIterator[tuple[CommitCutter, PostgresStore]]:
    """A store whose connections pass through a ``CommitCutter`` (armed by the test)."""
    proxy = CommitCutter(pg_cluster.port, marker=marker)
    await proxy.start()
    conninfo = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    try:
        async with opened(conninfo, new_schema()) as store:
            yield proxy, store
    finally:
        await proxy.stop()


@pytest.mark.parametrize("known", [True, False])
async def test_a_group_of_admissions_whose_commit_reply_was_lost_admits_each_once(
    pg_cluster: Cluster, known: bool
) -> None:
    """A group of admissions (a pipeline ending in ``COMMIT``) whose connection is cut after the
    server committed: each admission is read back and answered once, none written twice; with
    new conversations, each is created once."""
    names = [f"support/cut-{n}" for n in range(8)]
    async with behind_a_cutter(pg_cluster, b"COMMIT") as (proxy, store):
        if known:
            for name in names:
                await store.admit(NewSubmission(name, "support", "message", {"n": -1}))
        proxy.armed = True
        admitted = await asyncio.gather(
            *(
                store.admit(NewSubmission(name, "support", "message", {"n": n}))
                for n, name in enumerate(names)
            )
        )
        assert proxy.cuts == 1  # the first went alone (no COMMIT of its own); the group was cut
        assert [a.submission.payload for a in admitted] == [{"n": n} for n in range(8)]
        for name, admission in zip(names, admitted, strict=True):
            listed = await store.list_submissions(name)
            assert [s.payload for s in listed] == [{"n": -1}] * known + [{"n": names.index(name)}]
            assert listed[-1].id == admission.submission.id
            assert [r.type for r in await store.read(name)] == ["conversation_created"]


async def running_host_and_guests(store: PostgresStore, guests: int) -> tuple[Any, list[Any]]:
    """A claimed host that appended once (so joins may go in one statement), and queued
    guests behind it."""
    host = (await store.admit(NewSubmission(CONV, "support", "message", {}))).submission
    [running] = await store.claim("owner-1", 30.0, 1)
    assert await store.append(CONV, [msg(1, host.id)], fence=running.fence) == [1]
    queued = [
        (await store.admit(NewSubmission(CONV, "support", "message", {}))).submission
        for _ in range(guests)
    ]
    return running, queued


async def test_a_connection_lost_while_opening_is_the_clear_cannot_connect_error(
    pg_cluster: Cluster,
) -> None:
    """A server that goes away between the connection and the migration (a restart, a
    failover) is the same "cannot connect" as one that refuses the connection: nothing failed
    in the schema, and a supervisor restarting hearth shortly is the cure."""
    proxy = CommitCutter(pg_cluster.port, marker=b"search_path")  # the first query after connect
    await proxy.start()
    proxy.armed = True
    store = PostgresStore(
        f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres", schema=new_schema()
    )
    try:
        with pytest.raises(
            StoreUnavailable, match=r"^cannot connect to PostgreSQL at 127\.0\.0\.1"
        ):
            await store.open()
        assert proxy.cuts == 1
        await store.open()  # the server answers again: it opens
        await store.admit(NewSubmission(CONV, "support", "message", {}))
    finally:
        await store.close()
        await proxy.stop()


async def test_a_one_round_trip_admission_whose_reply_was_lost_is_read_back(
    pg_cluster: Cluster,
) -> None:
    async with behind_a_cutter(pg_cluster, b"FOR UPDATE;") as (proxy, store):  # lock + insert
        first = await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        proxy.armed = True
        second = await store.admit(NewSubmission(CONV, "support", "message", {"t": 2}))
        assert proxy.cuts == 1
        assert not second.deduplicated
        listed = await store.list_submissions(CONV)
        assert [s.id for s in listed] == [first.submission.id, second.submission.id]
        assert [s.payload for s in listed] == [{"t": 1}, {"t": 2}]


async def test_a_one_statement_join_whose_reply_was_lost_is_read_back_as_joined(
    pg_cluster: Cluster,
) -> None:
    async with behind_a_cutter(pg_cluster, b"guest AS") as (proxy, store):  # the join
        running, [guest] = await running_host_and_guests(store, 1)
        proxy.armed = True
        assert await store.join(running.fence, guest.id, [msg(2, guest.id)])
        assert proxy.cuts == 1
        ids = [r.id for r in await store.read(CONV)]
        assert ids == [f"{CONV}:created", "m1", "m2"]
        row = await store.get_submission(guest.id)
        assert row is not None and (row.status, row.joined_to) == ("joined", running.id)


async def test_joins_in_one_query_whose_reply_was_lost_are_read_back_as_joined(
    pg_cluster: Cluster,
) -> None:
    async with behind_a_cutter(pg_cluster, b"guest AS") as (proxy, store):  # the joins' query
        running, guests = await running_host_and_guests(store, 3)
        proxy.armed = True
        joins = [(g.id, [msg(n, g.id)]) for n, g in enumerate(guests, start=2)]
        assert await store.join_many(running.fence, joins) == 3
        assert proxy.cuts == 1
        ids = [r.id for r in await store.read(CONV)]
        assert ids == [f"{CONV}:created", "m1", "m2", "m3", "m4"]
        for guest in guests:
            row = await store.get_submission(guest.id)
            assert row is not None and (row.status, row.joined_to) == ("joined", running.id)


async def test_admissions_racing_into_an_idle_conversation_make_exactly_one_head(
    pg_cluster: Cluster,
) -> None:
    """Each admission decides whether it is its conversation's head once it holds the
    conversation's lock, with a snapshot that sees the admissions committed before it."""
    schema = new_schema()
    async with (
        opened(pg_cluster.conninfo, schema) as one,
        opened(pg_cluster.conninfo, schema) as two,
    ):
        first = (await one.admit(NewSubmission(CONV, "support", "message", {}))).submission
        [running] = await one.claim("owner-1", 30.0, 1)
        record = settlement(first.id, "completed", None, "ok")
        await one.settle(running.fence, record, outcome="completed", error=None, reply="ok")
        for round_ in range(5):  # the conversation is idle: every admission races to be head
            admitted = await asyncio.gather(
                *(
                    store.admit(NewSubmission(CONV, "support", "message", {"n": n}))
                    for n in range(8)
                    for store in (one, two)
                )
            )
            ids = [a.submission.id for a in admitted]
            async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as conn:
                cursor = await conn.execute(
                    f'SELECT id FROM "{schema}".submissions WHERE id = ANY(%s) AND is_head',
                    (ids,),
                )
                rows = await cursor.fetchall()
            assert len(rows) == 1, (round_, rows)
            # Settle them all, so that the next round starts idle again.
            while subs := await one.claim("owner-1", 30.0, 100):
                for sub in subs:
                    done = settlement(sub.id, "completed", None, "ok")
                    await one.settle(sub.fence, done, outcome="completed", error=None, reply="ok")


async def test_a_transaction_frozen_mid_way_gives_its_locks_up_after_a_while(
    pg_cluster: Cluster,
) -> None:
    from hearth.store.postgres_ops import fetchone

    async with opened(pg_cluster.conninfo, new_schema()) as store:
        row = await store._read(  # the setting every connection of the pool runs with
            lambda conn: fetchone(conn, "SHOW idle_in_transaction_session_timeout", {})
        )
        assert row == {"idle_in_transaction_session_timeout": "10s"}


async def test_a_renewal_does_not_wait_for_a_step_transaction_holding_its_row(
    pg_cluster: Cluster,
) -> None:
    """The renewal of all of an owner's leases, one statement, waited for the row lock of an
    application's open step.transaction: meanwhile every other lease of the process ran out
    and peers took its healthy work over. Here the transaction goes on only once the renewal
    has answered (it waited for each other for ever)."""
    async with opened(pg_cluster.conninfo, new_schema()) as store:
        for conversation in (CONV, "support/c-2"):
            await store.admit(NewSubmission(conversation, "support", "message", {"t": 1}))
        claimed = await store.claim("owner-1", 30.0, 2)
        (held,) = [s for s in claimed if s.conversation_id == CONV]
        locked, renewed = asyncio.Event(), asyncio.Event()

        async def books(conn: Any) -> int:
            locked.set()  # the fence is checked: the submission's row is locked
            await renewed.wait()
            return 1

        def records(value: Any) -> list[ToolStepSettled]:
            step = ToolStepSettled(
                id="m1:step:c1:book", tool_call_id="c1", step="book", value=value
            )
            return [step.stamped(held.id, held.attempt)]

        booking = asyncio.create_task(
            store.transact(CONV, held.fence, books, records, ids=["m1:step:c1:book"])
        )
        await asyncio.wait_for(locked.wait(), 10)
        leases = await asyncio.wait_for(store.renew_all("owner-1", 30.0), 10)
        renewed.set()
        assert {h.fence for h in leases} == {s.fence for s in claimed}
        (stored,) = await booking
        assert stored.id == "m1:step:c1:book"
        after = await store.renew_all("owner-1", 30.0)  # no transaction open: all renewed
        assert {h.fence for h in after} == {s.fence for s in claimed}


async def test_a_write_whose_session_the_idle_timeout_ended_is_tried_again(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends a transaction this process stood still in (stopped past the timeout):
    that was read as a refused write, a StoreError (the attempt ended as a bug of hearth's and
    a new one began), though nothing of it had committed."""
    from hearth.store import postgres_session
    from hearth.store.postgres_ops import fetchone

    monkeypatch.setattr(postgres_session, "IDLE_IN_TRANSACTION_MS", 300)
    tries = 0

    async def stands_still_once(conn: Any, outbox: Any) -> Any:
        nonlocal tries
        tries += 1
        await fetchone(conn, "SELECT 1 AS one", {})
        if tries == 1:
            await asyncio.sleep(1.0)  # past the timeout, inside the transaction
        return await fetchone(conn, "SELECT 2 AS two", {})

    async with opened(pg_cluster.conninfo, new_schema()) as store:
        assert await store._write(stands_still_once) == {"two": 2}
        assert tries == 2
        tries = 0
        with pytest.raises(StoreError, match="idle"):  # an application's: named, not retried
            await store._write(stands_still_once, idle_is_lost=False)
        assert tries == 1


async def test_a_version_5_schema_gains_the_attachment_store(pg_cluster: Cluster) -> None:
    import hashlib

    from hearth.store import Blob

    schema = new_schema()
    async with opened(pg_cluster.conninfo, schema) as store:
        old = (await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))).submission
    pg_cluster.sql(  # as version 5 left it: no attachment tables
        f"DROP TABLE {schema}.attachments; DROP TABLE {schema}.attachment_refs;"
        f" UPDATE {schema}.meta SET value = '5' WHERE key = 'schema_version'"
    )
    data = b"bytes after the upgrade"
    b = Blob(hashlib.sha256(data).hexdigest(), "text/plain", len(data), data)
    async with opened(pg_cluster.conninfo, schema) as store:
        assert await store.get_submission(old.id) == old
        await store.admit(NewSubmission("support/c-2", "support", "message", {"t": 2}, blobs=(b,)))
        got = await store.get_attachment(b.sha256)
        assert got is not None and got.data == data
    found = pg_cluster.sql(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
    assert found == str(SCHEMA_VERSION) == "11"


# --- over the server's limits ------------------------------------------------------------------


async def test_a_key_over_the_servers_limit_is_refused_at_once_not_retried_as_an_outage(
    pg_cluster: Cluster,
) -> None:
    """A record id of 5,000 characters that do not compress is over PostgreSQL's 2,704 bytes
    for a btree key: the server refuses it the same way every time. It was taken for a lost
    connection (its error class is an OperationalError) and retried until ``write_retry_s``
    ran out, then reported as the server being unreachable; now it is a ``StoreError`` saying
    what the server said, and the store goes on."""
    long_id = "".join(random.Random(7).choices(string.ascii_letters, k=5000))
    async with opened(pg_cluster.conninfo, new_schema(), write_retry_s=3.0) as store:
        await store.admit(NewSubmission(CONV, "support", "message", {"t": 1}))
        [running] = await store.claim("owner-1", 30.0, 1)
        fence = running.fence
        too_long = ToolStepSettled(id=long_id, tool_call_id="c", step="s", value=1).stamped(
            fence.submission_id, fence.attempt
        )
        for given in ({"fence": fence}, {}):  # the fenced (grouped) path and the plain one
            with pytest.raises(StoreError, match="index row size") as refused:
                await store.append(CONV, [too_long], **given)  # type: ignore[arg-type]
            assert not isinstance(refused.value, StoreUnavailable)
        fine = ToolStepSettled(id="fine", tool_call_id="c", step="s", value=1).stamped(
            fence.submission_id, fence.attempt
        )
        [offset] = await store.append(CONV, [fine], fence=fence)
        assert [r.id for r in await store.read(CONV, after=offset - 1)] == ["fine"]


async def test_the_clock_estimate_is_not_ahead_after_a_wait_for_a_connection(
    pg_cluster: Cluster,
) -> None:
    """The first reading was timed from before the wait for a pool connection: the estimate ran
    ahead of the database's clock by half that wait (0.48 s after a 1 s wait), and schedules
    and deadlines were judged early."""
    async with opened(pg_cluster.conninfo, new_schema(), pool_size=1) as store:

        async def hog() -> None:
            await store._read(lambda conn: conn.execute("SELECT pg_sleep(1.0)"))

        held = asyncio.create_task(hog())
        await asyncio.sleep(0.05)
        await store.now()  # its reading waits for the only connection
        await held
        estimate = await store.now()
        row = await store._read(
            lambda conn: ops.fetchone(
                conn, "SELECT extract(epoch FROM clock_timestamp())::float8 AS t", {}
            )
        )
        assert row is not None
        assert estimate - float(row["t"]) < 0.1  # (a read's round trip here: milliseconds)
