"""A PostgreSQL store keeps working when its tables change shape under it.

psycopg prepares a statement on a connection once it has run there a few times (and hearth
prepares its grouped admissions at once). A ``SELECT *`` or ``RETURNING *`` prepared before a
column is added is refused afterwards ("cached plan must not change result type") for as long
as that connection lives: what a process of the previous release meets when a newer one
migrates the schema during a rolling redeploy. The store replaces such a connection and runs
the work again; nothing is lost and nothing is written twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import psycopg
import pytest
from pgcluster import Cluster, new_schema

from hearth.records import ToolStepSettled
from hearth.store import NewSubmission
from hearth.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio

TABLES = ("submissions", "records", "conversations")


@pytest.fixture
async def store(pg_cluster: Cluster) -> AsyncIterator[PostgresStore]:
    made = PostgresStore(pg_cluster.conninfo, schema=new_schema(), pool_size=2)
    await made.open()
    try:
        yield made
    finally:
        await made.close()


def new(conversation_id: str, text: str, key: str | None = None) -> NewSubmission:
    return NewSubmission(conversation_id, "support", "message", {"text": text}, idempotency_key=key)


async def workload(store: PostgresStore, names: list[str], round_: int) -> None:
    """One of each kind of work, each checked: admissions alone and in a group, reads of
    submissions, a claim, appends under its fence, a read of the stream, a release."""
    alone = await store.admit(new(names[0], f"alone {round_}", key=f"k-{round_}"))
    again = await store.admit(new(names[0], f"alone {round_}", key=f"k-{round_}"))
    assert again.submission.id == alone.submission.id and again.deduplicated
    grouped = await asyncio.gather(*(store.admit(new(n, f"group {round_}")) for n in names))
    assert len({a.submission.id for a in grouped}) == len(names)
    for admission in [alone, *grouped]:
        found = await store.get_submission(admission.submission.id)
        assert found is not None and found.payload == admission.submission.payload
    listed = await store.get_submissions([a.submission.id for a in grouped])
    assert sorted(s.id for s in listed) == sorted(a.submission.id for a in grouped)
    claimed = await store.claim(f"owner-{round_}", 60, 1)
    assert len(claimed) == 1
    fence = claimed[0].fence
    conversation = claimed[0].conversation_id
    before = len(await store.read(conversation))
    for step in range(3):
        record = ToolStepSettled(
            id=f"{fence.submission_id}:step:{round_}.{step}",
            tool_call_id="call",
            step=f"s{round_}.{step}",
            value=1,
        ).stamped(fence.submission_id, fence.attempt)
        await store.append(conversation, [record], fence=fence)
    assert len(await store.read(conversation)) == before + 3
    assert await store.release(fence, f"owner-{round_}")  # queued again, for the next round


async def test_work_goes_on_after_a_migration_adds_columns(
    store: PostgresStore, pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"support/stale-{n}" for n in range(6)]
    for name in names:
        await store.admit(new(name, "first"))
    for round_ in range(8):  # enough runs on both connections for psycopg to prepare
        await workload(store, names, round_)

    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo, autocommit=True) as c:
        for table in TABLES:
            await c.execute(f"ALTER TABLE {store.schema}.{table} ADD COLUMN added_later integer")

    with caplog.at_level(logging.WARNING, logger="hearth.store.postgres"):
        for round_ in range(8, 12):
            await workload(store, names, round_)
    # The fault was there to meet: connections held plans the new columns made stale.
    assert any("no longer fits" in r.getMessage() for r in caplog.records)

    async with await psycopg.AsyncConnection.connect(pg_cluster.conninfo) as c:
        cursor = await c.execute(
            f"SELECT count(*), count(DISTINCT idempotency_key) FROM {store.schema}.submissions"
            " WHERE idempotency_key IS NOT NULL"
        )
        assert await cursor.fetchone() == (12, 12)  # each keyed admission once, none twice
