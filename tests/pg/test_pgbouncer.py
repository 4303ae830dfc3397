"""The PostgreSQL store behind pgbouncer: in session mode it works as on a direct connection,
its schema applied whatever the pooler does with startup parameters; in transaction mode it is
refused at open, saying why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from bouncer import PgBouncer
from pgcluster import Cluster, new_schema

from hearth.errors import StoreError
from hearth.store import NewSubmission
from hearth.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _admits_into_its_own_schema(pg_cluster: Cluster, bouncer: PgBouncer) -> None:
    schema = new_schema()
    store = PostgresStore(bouncer.conninfo, schema=schema)
    await store.open()
    try:
        admission = await store.admit(NewSubmission("a/c", "a", "message", {"message": "hi"}))
        assert admission is not None
        assert store._transactions is not None
        async with store._transactions.pool.connection() as conn:
            cursor = await conn.execute("SELECT current_schema() AS s")
            assert await cursor.fetchone() == {"s": schema}
    finally:
        await store.close()
    assert pg_cluster.sql(f"SELECT count(*) FROM {schema}.submissions") == "1"


async def test_a_pooler_that_drops_the_startup_options_still_gets_the_schema(
    pg_cluster: Cluster, pgbouncer: Callable[..., PgBouncer]
) -> None:
    """pgbouncer told to ignore ``options`` dropped hearth's search_path: every statement ran in
    the role's default schema (another deployment's tables, when it had them)."""
    await _admits_into_its_own_schema(pg_cluster, pgbouncer("session", "options"))


async def test_a_session_mode_pooler_that_refuses_startup_options_works(
    pg_cluster: Cluster, pgbouncer: Callable[..., PgBouncer]
) -> None:
    """pgbouncer refuses the ``options`` startup parameter: every pooled connection failed, and
    the store reported the server unreachable."""
    await _admits_into_its_own_schema(pg_cluster, pgbouncer("session"))


async def test_a_pooler_in_transaction_mode_is_refused_at_open(
    pgbouncer: Callable[..., PgBouncer],
) -> None:
    """Sessions do not last across transactions there (prepared statements, LISTEN, settings):
    the store answered 202, then failed its work."""
    bouncer = pgbouncer("transaction")
    store = PostgresStore(bouncer.conninfo, schema=new_schema())
    with pytest.raises(StoreError, match="transaction mode"):
        await store.open()
    await store.close()


async def test_behind_a_pooler_a_try_cut_at_its_limit_is_ended_on_the_server(
    pg_cluster: Cluster, pgbouncer: Callable[..., PgBouncer]
) -> None:
    """The session of a transaction cut at its limit was looked for by libpq's backend pid,
    which behind pgbouncer is the pooler's own key: nothing was ended, the statement ran on
    holding its locks, and the lease renewals of the process waited behind it."""
    store = PostgresStore(pgbouncer("session").conninfo, schema=new_schema(), write_retry_s=3.0)
    await store.open()
    try:

        async def slow(conn: Any, outbox: object) -> None:
            await conn.execute("SELECT pg_sleep(30)")

        with pytest.raises(StoreError, match="ran past its 2 s and was ended on the server"):
            await store._write(slow, idle_is_lost=False, try_s=2.0, overrun_is_final=True)
        running = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'"
        assert pg_cluster.sql(running) == "0"
    finally:
        await store.close()
