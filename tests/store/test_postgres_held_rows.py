"""An admission that waits for a conversation's row another transaction holds (a fork copying it
holds it for as long as the copy takes) and runs out of time: its caller hears 503, and nothing
of it may commit afterwards, or the caller's retry would admit the same work twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import psycopg
import pytest
from pgcluster import Cluster, new_schema

from hearth.errors import StoreUnavailable
from hearth.store import NewSubmission
from hearth.store.postgres import PostgresStore
from hearth.store.rows import Admission

pytestmark = pytest.mark.anyio

HELD = "support/held"
ANSWER_BOUND_S = 2.0 + 1.0  # 503 within 2 s (tests/pg/test_serve_postgres.py), and slack


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def new(conversation_id: str, text: str) -> NewSubmission:
    return NewSubmission(conversation_id, "support", "message", {"text": text})


async def stored(store: PostgresStore) -> Counter[str]:
    """Submissions per conversation, as the database has them."""
    found: Counter[str] = Counter()
    after = 0
    while page := await store.list_submissions(after=after):
        found.update(s.conversation_id for s in page)
        after = page[-1].seq
    return found


async def holding(pg_cluster: Cluster, store: PostgresStore, seconds: float) -> None:
    """Hold the row of ``HELD`` for ``seconds``, as a fork holds its source's."""
    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as side:
        await side.execute(
            f"SELECT 1 FROM {store.schema}.conversations WHERE conversation_id = %s FOR SHARE",
            (HELD,),
        )
        await asyncio.sleep(seconds)
        await side.rollback()


async def test_an_admission_refused_for_a_held_row_is_not_admitted_once_the_row_is_free(
    pg_cluster: Cluster, pg_store: PostgresStore
) -> None:
    store = pg_store
    await store.admit(new(HELD, "first"))
    held = asyncio.create_task(holding(pg_cluster, store, 4.0))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await store.admit(new(HELD, "refused"))
    took = time.monotonic() - started
    await held
    await asyncio.sleep(0.5)  # (what was still waiting for the row has had its turn)
    assert await stored(store) == Counter({HELD: 1})
    assert took < ANSWER_BOUND_S
    assert (await store.admit(new(HELD, "again"))).submission.payload == {"text": "again"}


async def test_admissions_grouped_with_one_for_a_held_row_are_stored_exactly_when_answered(
    pg_cluster: Cluster, pg_store: PostgresStore
) -> None:
    store = pg_store
    """Admissions sent at once are written in groups (the first alone, those sent meanwhile
    together): a group with one for the held row waits as a whole, is cut, and each of its
    admissions goes alone. The group's session is ended on the server: it held the rows of the
    other conversations too, until the held row was free (their admissions answered 503)."""
    others = [f"support/free-{n}" for n in range(6)]
    for name in [HELD, *others]:
        await store.admit(new(name, "first"))  # (known conversations: the grouped path)
    held = asyncio.create_task(holding(pg_cluster, store, 6.0))
    await asyncio.sleep(0.3)
    targets = [others[0], HELD, *others[1:], HELD]
    started = time.monotonic()
    answers = await asyncio.gather(
        *(store.admit(new(name, f"at once {n}")) for n, name in enumerate(targets)),
        return_exceptions=True,
    )
    took = time.monotonic() - started
    after = await store.admit(new(others[1], "after the cut"))  # (the row is held no more)
    assert not held.done()
    await held
    await asyncio.sleep(0.5)
    for answer in answers:
        assert isinstance(answer, Admission | StoreUnavailable), answer
    answered = Counter(a.submission.conversation_id for a in answers if isinstance(a, Admission))
    assert answered[HELD] == 0
    assert await stored(store) == Counter([HELD, *others, after.submission.conversation_id]) + (
        answered
    )
    assert took < ANSWER_BOUND_S + 1.0  # (a group cut, then each alone: one more short try)


async def test_a_burst_beside_a_held_row_stores_exactly_what_it_was_told(
    pg_cluster: Cluster,
) -> None:
    """With every connection of the pool queued for, the look after a cut asked the pool for one
    of them, gave up, answered 503, and the cut admission was stored once the row was free."""
    opened = PostgresStore(pg_cluster.conninfo, schema=new_schema(), pool_size=2)
    await opened.open()
    try:
        names = [f"support/burst-{n}" for n in range(150)]
        for name in [HELD, *names]:
            await opened.admit(new(name, "first"))
        held = asyncio.create_task(holding(pg_cluster, opened, 6.0))
        await asyncio.sleep(0.3)
        targets = [names[0], HELD, *names[1:], HELD, *names, HELD]
        answers = await asyncio.gather(
            *(opened.admit(new(name, f"burst {n}")) for n, name in enumerate(targets)),
            return_exceptions=True,
        )
        await held
        await asyncio.sleep(0.5)
        for answer in answers:
            assert isinstance(answer, Admission | StoreUnavailable), answer
        answered = Counter(
            a.submission.conversation_id for a in answers if isinstance(a, Admission)
        )
        have, told = await stored(opened), Counter([HELD, *names]) + answered
        errors = Counter(str(a)[:120] for a in answers if not isinstance(a, Admission))
        assert have == told, (have - told, told - have, errors)
    finally:
        await opened.close()


async def test_a_commit_waiting_for_a_synchronous_standby_is_not_ended_and_called_written(
    pg_cluster: Cluster, pg_store: PostgresStore
) -> None:
    store = pg_store
    """Ended while its commit waited for a synchronous standby, a cut admission's commit stood
    on the primary alone, never confirmed, and the read back that followed called it admitted.
    It is left to wait: its outcome is unknown, said as such."""
    await store.admit(new(HELD, "first"))
    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo, autocommit=True) as admin:
        await admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        await admin.execute("SELECT pg_reload_conf()")
        try:
            await asyncio.sleep(0.3)  # (the reload reaches the sessions)
            with pytest.raises(StoreUnavailable) as caught:
                await store.admit(new(HELD, "unconfirmed"))
            assert "wrote nothing" not in str(caught.value)
            cursor = await admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            )
            assert (await cursor.fetchone())[0] >= 1  # (still waiting, not ended)
        finally:
            await admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            await admin.execute("SELECT pg_reload_conf()")


async def test_only_a_session_still_running_the_cut_try_is_ended(
    pg_cluster: Cluster, pg_store: PostgresStore
) -> None:
    store = pg_store
    """Behind a pooler in session mode, the server session a cut try ran on may serve another
    client by the time of the look: the pid alone ended that client's work. A session whose
    transaction began after the cut is not the try's; one that began before it is."""
    tx = store._tx()
    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as other:
        pid = other.info.backend_pid
        began = time.monotonic()
        await asyncio.sleep(0.5)
        cut_at = time.monotonic()
        await asyncio.sleep(0.2)
        await other.execute("SELECT 1")  # another client's transaction, begun after the cut
        assert await tx.session_over(pid, began, cut_at, time.monotonic() + 2)  # not the try's
        await other.execute("SELECT 1")  # (still there)
        await other.rollback()
    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as cut:
        pid = cut.info.backend_pid
        began = time.monotonic()
        await cut.execute("SELECT 1")  # the try's transaction, begun before the cut, still open
        await asyncio.sleep(0.5)
        cut_at = time.monotonic()
        assert await tx.session_over(pid, began, cut_at, time.monotonic() + 2)  # ended
        with pytest.raises(psycopg.OperationalError):
            await cut.execute("SELECT 1")
