"""An admission that waits for a conversation's row another transaction holds (a fork copying it
holds it for as long as the copy takes) and runs out of time: its caller hears 503, and nothing
of it may commit afterwards, or the caller's retry would admit the same work twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

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


@pytest.fixture
async def store(pg_cluster: Cluster) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(pg_cluster.conninfo, schema=new_schema())
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


def new(conversation_id: str, text: str) -> NewSubmission:
    return NewSubmission(conversation_id, "support", "message", {"text": text})


async def stored(store: PostgresStore) -> Counter[str]:
    """Submissions per conversation, as the database has them."""
    return Counter(s.conversation_id for s in await store.list_submissions())


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
    pg_cluster: Cluster, store: PostgresStore
) -> None:
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
    pg_cluster: Cluster, store: PostgresStore
) -> None:
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
