"""The PostgreSQL store over a network that fails silently: connections whose peer stops
answering without closing them (a dropped flow, a hung middlebox), as a loopback proxy plays
them. Each such connection is given up on within a bound, never waited on for good."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from pgcluster import Cluster, new_schema
from pgproxy import PgProxy

from hearth.errors import StoreUnavailable
from hearth.store import NewSubmission
from hearth.store.events import Event
from hearth.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio

CONV = "support/c-1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def through_proxy(
    pg_cluster: Cluster, **options: object
) -> AsyncIterator[tuple[PostgresStore, PgProxy]]:
    proxy = PgProxy(pg_cluster.port)
    await proxy.start()
    store = PostgresStore(proxy.conninfo, schema=new_schema(), **options)  # type: ignore[arg-type]
    try:
        await store.open()
        yield store, proxy
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(store.close(), 30)
        await proxy.stop()


def new(n: int = 1) -> NewSubmission:
    return NewSubmission(CONV, "support", "message", {"t": n})


async def test_every_connection_asks_the_kernel_to_notice_a_silent_peer(
    pg_cluster: Cluster,
) -> None:
    """TCP keepalives and a user timeout on the pool's, the listener's and a lone connection,
    so a peer that vanished fails them within seconds; a URL's own values are kept."""
    store = PostgresStore(pg_cluster.conninfo + "?keepalives_idle=30", schema=new_schema())
    await store.open()
    try:

        def options(conn: psycopg.AsyncConnection[object]) -> dict[str, str]:
            return {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}

        async with store._tx().pool.connection() as pooled:
            seen = [options(pooled)]
        async with await store._connect_alone(5) as alone:
            seen.append(options(alone))
        listening = await store._listening()
        async with listening:
            seen.append(options(listening))
        for found in seen:
            assert found["keepalives"] == "1"
            assert found["keepalives_idle"] == "30"  # the URL's
            assert found["keepalives_interval"] == "2"
            assert found["keepalives_count"] == "3"
            assert found["tcp_user_timeout"] == "15000"
    finally:
        await store.close()


async def test_an_admission_on_a_connection_that_stopped_answering_answers_within_two_seconds(
    pg_cluster: Cluster,
) -> None:
    """The pool's connection stops answering (its flow dropped): the admission on it answered
    only once the network healed (for good, here); now it gives up within its budget, and the
    connection is replaced, so the next admission is taken."""
    async with through_proxy(pg_cluster, pool_size=1) as (store, proxy):
        await store.admit(new(1))
        await store.notified()
        assert proxy.strand() >= 1
        began = time.monotonic()
        with contextlib.suppress(StoreUnavailable):
            await asyncio.wait_for(store.admit(new(2)), 30)
        assert time.monotonic() - began < 2.5
        admission = await asyncio.wait_for(store.admit(new(3)), 10)
        assert admission.submission.conversation_id == CONV


async def test_a_read_on_a_connection_that_stopped_answering_is_asked_again_on_another(
    pg_cluster: Cluster,
) -> None:
    """A read (what a GET or a long-poll asks) whose connection stops answering is given up
    on after a few seconds and asked on a new connection, which answers."""
    async with through_proxy(pg_cluster, pool_size=1) as (store, proxy):
        admitted = await store.admit(new(1))
        await store.notified()
        assert proxy.strand() >= 1
        began = time.monotonic()
        found = await asyncio.wait_for(store.get_submission(admitted.submission.id), 30)
        assert found is not None and found.id == admitted.submission.id
        assert time.monotonic() - began < 9


async def test_a_ping_on_a_connection_that_stopped_answering_fails_within_its_time(
    pg_cluster: Cluster,
) -> None:
    """/healthz's ping on a pooled connection that stopped answering: it failed only once
    psycopg's cancel request had been waited for (6 s and more past its 1.5 s)."""
    async with through_proxy(pg_cluster, pool_size=1) as (store, proxy):
        await store.ping(1.5)
        assert proxy.strand() >= 1
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match="no answer"):
            await asyncio.wait_for(store.ping(1.5), 30)
        assert time.monotonic() - began < 4


async def test_a_listener_whose_connection_stopped_answering_reconnects_and_hears_again(
    pg_cluster: Cluster,
) -> None:
    """Only the listener's connection goes silent: it listened on for good, so a peer's
    commits (an abort among them) reached this process at scan speed only; it now checks its
    quiet connection, gives it up and listens on a new one."""
    async with through_proxy(pg_cluster) as (store, proxy):
        before = store.listener_pid
        async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as admin:
            cursor = await admin.execute(
                "SELECT client_port FROM pg_stat_activity WHERE pid = %s", [before]
            )
            row = await cursor.fetchone()
        assert row is not None
        assert proxy.strand(row[0]) == 1
        listener = store._listener
        assert listener is not None
        async with asyncio.timeout(30):
            while store.listener_pid == before or not listener.connected.is_set():
                await asyncio.sleep(0.1)
        heard: list[Event] = []
        store.events.listen(heard.append)
        peer = PostgresStore(pg_cluster.conninfo, schema=store.schema)
        await peer.open()
        try:
            admitted = await peer.admit(new(1))
            await peer.notified()
        finally:
            await peer.close()
        async with asyncio.timeout(10):
            while not any(e.submission_id == admitted.submission.id for e in heard):
                await asyncio.sleep(0.05)


async def test_a_store_whose_listener_waits_on_a_silent_server_closes_at_once(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener asking its quiet connection whether it is alive when the server stops
    answering: closing the store cancelled that question, and psycopg then asked the server to
    cancel it on a new connection, which held the close 10 s. Its connection is cut instead."""
    from hearth.store import postgres_listen

    monkeypatch.setattr(postgres_listen, "_QUIET_S", 0.2)  # it asks soon ...
    monkeypatch.setattr(postgres_listen, "_CHECK_S", 60.0)  # ... and waits for the answer
    async with through_proxy(pg_cluster) as (store, proxy):
        proxy.freeze()
        await asyncio.sleep(1.0)  # the listener is asking, and no answer comes
        began = time.monotonic()
        await asyncio.wait_for(store.close(), 30)
        assert time.monotonic() - began < 3


async def test_on_a_slow_link_connections_held_by_transactions_are_a_busy_pool(
    pg_cluster: Cluster,
) -> None:
    """A round trip of 500 ms, the pool's connection held by a long transaction: the server
    was asked alone on a new connection within 1.5 s, which such a link cannot open, and the
    admission answered 503 calling it unreachable; work finished lately shows it answers, and
    the admission waits for the connection."""
    async with through_proxy(pg_cluster, pool_size=1) as (store, proxy):
        proxy.latency = 0.25  # from now on (opening the store takes many round trips)
        await store.admit(new(1))
        release = asyncio.Event()

        async def held() -> None:  # an application's step.transaction, say
            async with store._tx().pool.connection() as conn:
                await release.wait()
                await conn.execute("SELECT 1")

        holder = asyncio.create_task(held())
        try:
            await asyncio.sleep(1.6)  # nothing finishes for longer than an admission's budget
            admitting = asyncio.create_task(store.admit(new(2)))
            await asyncio.sleep(4.0)
            assert not admitting.done()
            release.set()
            admission = await asyncio.wait_for(admitting, 30)
            assert admission.submission.conversation_id == CONV
        finally:
            release.set()
            await holder


async def test_a_busy_pool_says_how_long_it_was_waited_for(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection in use, work finishing meanwhile, and the caller given up on (here: the
    question asked alone failed): the 503 said the pool was in use for 30 s after 1.5 s."""
    async with through_proxy(pg_cluster, pool_size=1) as (store, _proxy):
        transactions = store._tx()
        release = asyncio.Event()

        async def answers_not(timeout: float = 0.0, *, until: float | None = None) -> bool:
            transactions.progressed()  # pooled work finished as the question failed
            return False

        monkeypatch.setattr(transactions, "answering", answers_not)

        async def held() -> None:
            async with transactions.pool.connection() as conn:
                await release.wait()
                await conn.execute("SELECT 1")

        holder = asyncio.create_task(held())
        try:
            while not transactions._exhausted():
                await asyncio.sleep(0.01)
            with pytest.raises(StoreUnavailable, match=r"in use for 1\.\d s"):
                await asyncio.wait_for(store.admit(new(1)), 30)
        finally:
            release.set()
            await holder


async def test_a_pool_busy_with_long_statements_on_a_live_server_is_busy_not_down(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Every pooled connection in one statement running longer than 5 s (a slow query in a
    step.transaction, a wait on a row lock) on a server that answers: a judgement that took
    such a pool for stuck answered /healthz and admissions 503 (reverted; README: /healthz stays
    200 while the server answers, and an admission waits for a connection)."""
    async with through_proxy(pg_cluster, pool_size=2) as (store, _):
        tx = store._tx()

        async def slow(conn: psycopg.AsyncConnection[object], outbox: object) -> str:
            await conn.execute("SELECT pg_sleep(7)")
            return "slow done"

        works = [asyncio.create_task(tx.write(slow, budget_s=30.0)) for _ in range(2)]
        await asyncio.sleep(5.5)  # both statements past 5 s without an answer
        await store.ping(1.5)  # the server answers: not down
        admission = await store.admit(new(1))  # waits for a connection, then admits
        assert admission.submission.conversation_id == CONV
        assert await asyncio.gather(*works) == ["slow done", "slow done"]
    assert "the network lost it" not in caplog.text  # their sessions were active: not cut


async def test_a_try_being_abandoned_when_its_caller_is_cancelled_is_cancelled_too() -> None:
    """A caller cancelled while its cut try was given a moment to end left that try running
    (work of the application's inside a step.transaction, say), its error never retrieved."""
    from hearth.store import postgres_deadline

    class Gone:
        @property
        def socket(self) -> int:
            raise psycopg.OperationalError("the connection is closed")

    class Conn:
        pgconn = Gone()

    ended: list[str] = []

    async def deaf() -> None:  # not waiting on the server: a cut does not end it
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    caller = asyncio.create_task(postgres_deadline.within(Conn(), deaf(), 0.1))  # type: ignore[arg-type]
    await asyncio.sleep(0.5)  # past the deadline: the try is being abandoned
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.sleep(0.05)
    assert ended == ["cancelled"]


@pytest.mark.parametrize("sweeper", ["running", "ended by a stray cancellation"])
async def test_work_on_connections_the_network_stranded_goes_on_within_seconds(
    pg_cluster: Cluster, sweeper: str
) -> None:
    """Every connection of the pool stranded at once (a firewall's table flushed) under writes
    that may run 30 s: each waited its whole limit, and a renewal of leases among them let the
    leases lapse. The server shows their sessions idle, so they are cut and the work retried.
    A sweeper that ended is started again (it was not: the tries waited their limit again)."""
    async with through_proxy(pg_cluster, pool_size=2) as (store, proxy):
        tx = store._tx()

        async def write(conn: psycopg.AsyncConnection[object], outbox: object) -> str:
            await conn.execute("SELECT 1")
            return "written"

        await asyncio.gather(tx.write(write, budget_s=30.0), tx.write(write, budget_s=30.0))
        writes = 3  # (one more than the pool holds: it asks whether the server answers too)
        if sweeper != "running":
            assert tx._sweeper is not None
            tx._sweeper.cancel()
            await asyncio.gather(tx._sweeper, return_exceptions=True)
            await tx.write(write, budget_s=30.0)
            writes = 2  # (only the sweeper looks)
        assert proxy.strand() >= 2
        began = time.monotonic()
        done = await asyncio.gather(*(tx.write(write, budget_s=30.0) for _ in range(writes)))
        assert done == ["written"] * writes
        assert time.monotonic() - began < 10  # (30 s: the tries' limit)


async def test_a_transaction_whose_own_code_takes_its_time_is_not_taken_for_stranded(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A step.transaction's function working seconds between its statements leaves its session
    idle inside the transaction, not idle: it is left alone, and runs once."""
    async with through_proxy(pg_cluster, pool_size=1) as (store, _):
        tx = store._tx()
        runs: list[int] = []

        async def unhurried(conn: psycopg.AsyncConnection[object], outbox: object) -> str:
            runs.append(1)
            await conn.execute("SELECT 1")
            await asyncio.sleep(3.5)  # past what a stranded connection is given
            await conn.execute("SELECT 2")
            return "done"

        assert await tx.write(unhurried, budget_s=30.0) == "done"
        assert runs == [1]
    assert "the network lost it" not in caplog.text


async def test_a_new_connection_whose_settings_get_no_answer_does_not_stop_the_pool_growing(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server accepts a connection and then answers nothing (hearth's session settings
    hang): the pool waited on it for good, and grows one connection at a time, so it never grew
    again. The settings get a time limit, and the pool's next try connects."""
    from hearth.store import postgres

    monkeypatch.setattr(postgres, "SETUP_TRY_S", 1.0)
    async with through_proxy(pg_cluster, pool_size=2) as (store, proxy):
        pool = store._tx().pool
        held = await pool.getconn()
        try:
            proxy.hold_on = b"search_path"  # hearth's settings, the first thing it sends
            getting = asyncio.create_task(pool.getconn(timeout=20))
            await asyncio.sleep(0.5)
            proxy.hold_on = None
            other = await asyncio.wait_for(getting, 25)
            await pool.putconn(other)
        finally:
            await pool.putconn(held)


async def test_on_a_slow_link_a_resolve_and_an_abort_get_the_round_trips_they_need(
    pg_cluster: Cluster,
) -> None:
    """A round trip of 140 ms: a wait's resolve (a dozen round trips, one after another) took
    longer than its 1.5 s budget, was cut and answered 503 "unreachable" every time, while the
    same server served reads and admissions. A try gets the round trips it needs."""
    from test_conformance import CONV as WAITING_CONV
    from test_conformance_waits import waiting

    async with through_proxy(pg_cluster) as (store, proxy):
        await waiting(store)
        proxy.latency = 0.07
        store._tx()._took.clear()  # (as for a store whose link was always this slow)
        for _ in range(3):
            await store.get_submission("s_none")
        wait = await store.resolve_wait(WAITING_CONV, "w_approval", {"ok": True})
        assert wait.state == "resolved"
        await store.request_abort(WAITING_CONV)


async def test_a_large_answer_still_arriving_on_a_slow_link_is_not_taken_for_stranded(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A read of 6 MB at 2 MB/s: the server has put its whole answer in the kernel's buffers and
    shows its session idle while the answer still arrives for seconds. It was cut as stranded,
    again at every retry, until the read failed; what arrives shows it is not."""
    from hearth.records import UserMessage

    async with through_proxy(pg_cluster) as (store, proxy):
        await store.admit(new(1))
        big = UserMessage(id="big", message_id="big", content="x" * 6_000_000)
        await store.append(CONV, [big])
        proxy.down_rate = 2_000_000
        records = await store.read(CONV)
        assert [r.id for r in records][-1] == "big"
    assert "the network lost it" not in caplog.text


async def test_slow_tries_of_their_own_do_not_make_an_admission_wait_out_a_silent_server(
    pg_cluster: Cluster,
) -> None:
    """Tries slow for reasons of their own (step.transactions whose code took 2 s) were taken
    for a slow link: an admission's try on a connection the server no longer answered got 20
    such "round trips", up to 30 s. The allowance for a slow link is at most a probe's time."""
    async with through_proxy(pg_cluster, pool_size=1) as (store, proxy):
        await store.admit(new(1))
        store._tx()._took.extend([2.0] * 20)
        proxy.freeze()
        began = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.admit(new(2))
        assert time.monotonic() - began < 8  # (30 s without the bound)


async def test_a_server_read_only_for_a_while_is_an_outage_and_work_resumes_after_it(
    pg_cluster: Cluster,
) -> None:
    """A write on a read-only session (a standby after a failover, a database frozen for
    maintenance) was a StoreError, which failed attempts as a bug of the runtime; and the
    pool kept its read-only sessions, so writes failed for the hour of their lifetime after
    the server was writable again."""
    database = f"ro_{uuid.uuid4().hex[:8]}"
    pg_cluster.sql(f"CREATE DATABASE {database}")
    url = f"postgresql://postgres@127.0.0.1:{pg_cluster.port}/{database}"
    store = PostgresStore(url, schema=new_schema(), write_retry_s=1.0)
    await store.open()
    try:
        await store.admit(new(1))
        pg_cluster.sql(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
        pg_cluster.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{database}' AND pid <> pg_backend_pid()"
        )
        with pytest.raises(StoreUnavailable, match=r"cannot take writes now: .*read-only"):
            for _ in range(20):  # (a first try may meet a connection the terminate cut)
                await store.admit(new(2))
                await asyncio.sleep(0.2)
        with pytest.raises(StoreUnavailable, match="read-only"):
            await store.ping(1.5)
        pg_cluster.sql(f"ALTER DATABASE {database} RESET default_transaction_read_only")
        admitted = await asyncio.wait_for(store.admit(new(3)), 10)
        assert admitted.submission.conversation_id == CONV
        await store.ping(1.5)
    finally:
        await store.close()
        pg_cluster.sql(f"DROP DATABASE {database} WITH (FORCE)")


async def test_healthz_after_an_administrator_ended_the_sessions_asks_a_new_connection(
    pg_cluster: Cluster,
) -> None:
    """``pg_terminate_backend`` of the pool's sessions (an idle-session cleanup, a server
    restart): the next ping met a dead pooled connection and answered 503 "unreachable"
    while the server answered, and a balancer took the node out."""
    store = PostgresStore(pg_cluster.conninfo, schema=new_schema())
    await store.open()
    try:
        await store.ping(1.5)
        pg_cluster.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " AND query NOT LIKE 'LISTEN%'"
        )
        await store.ping(1.5)
    finally:
        await store.close()


async def test_a_transaction_whose_link_was_lost_is_not_taken_for_one_past_its_time(
    pg_cluster: Cluster,
) -> None:
    """A step.transaction's try cut at its limit because its link was lost (its function was
    quick; its statement never reached the server) was reported as one that ran past its
    time, and not run again: it is a lost connection, and runs again (nothing committed)."""
    async with through_proxy(pg_cluster, write_retry_s=8.0) as (store, proxy):
        runs = 0

        async def work(conn: psycopg.AsyncConnection[object], outbox: object) -> str:
            nonlocal runs
            runs += 1
            cursor = await conn.execute(
                "SELECT client_port FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            )
            row = await cursor.fetchone()
            if runs == 1:
                assert row is not None and proxy.strand(row["client_port"]) == 1
            await conn.execute("SELECT 1")
            return f"ran {runs} times"

        done = await store._write(work, idle_is_lost=False, try_s=3.0, overrun_is_final=True)
        assert done == "ran 2 times"


async def test_admissions_at_once_on_a_server_that_stopped_answering_each_answer_within_two_seconds(
    pg_cluster: Cluster,
) -> None:
    """Admissions sent at once as the server froze go in groups; a group cut at its time sent
    each of its admissions alone, and that try waited for the pool (every connection stuck)
    and asked whether the server answers: 2.6 to 3.5 s."""
    async with through_proxy(pg_cluster, pool_size=4) as (store, proxy):
        names = [f"support/frozen-{n}" for n in range(8)]
        for name in names:
            await store.admit(NewSubmission(name, "support", "message", {"t": 0}))
        proxy.freeze()

        async def timed(name: str) -> float:
            began = time.monotonic()
            with contextlib.suppress(StoreUnavailable):
                await asyncio.wait_for(
                    store.admit(NewSubmission(name, "support", "message", {"t": 1})), 30
                )
            return time.monotonic() - began

        for _ in range(2):
            took = await asyncio.gather(*(timed(name) for name in names))
            assert max(took) < 2.5, sorted(took)
