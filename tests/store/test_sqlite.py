"""Behaviour of the SQLite store that the store contract leaves to each implementation."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import hearth.store
from hearth.errors import ConfigurationError, IntegrityError, SchemaTooNew, StoreError
from hearth.records import UserMessage
from hearth.store import (
    NewSubmission,
    SQLiteStore,
    Store,
    open_store,
    rules,
    sqlite_ops,
    sqlite_writer,
)
from hearth.store.rules import settlement
from hearth.store.sqlite_schema import SCHEMA_VERSION
from hearth.testing.clock import ManualClock

pytestmark = pytest.mark.anyio

SRC = str(Path(hearth.store.__file__).resolve().parents[2])


def new(conversation_id: str) -> NewSubmission:
    return NewSubmission(conversation_id, "support", "message", {"text": "hi"})


def msg(n: int, content: str = "hello") -> UserMessage:
    return UserMessage(id=f"m{n}", message_id=f"m{n}", content=content)


async def opened(path: Path | str, clock: ManualClock | None = None) -> SQLiteStore:
    store = SQLiteStore(str(path), clock=clock)
    await store.open()
    return store


async def until_submitted(store: SQLiteStore, count: int) -> None:
    for _ in range(1000):
        if store.submitted >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"only {store.submitted} operations were queued")


# --- owning the file -------------------------------------------------------------------------


async def test_a_second_process_cannot_open_a_file_another_process_owns(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path)
    script = (
        "import asyncio, sys\n"
        "from hearth.errors import StoreError\n"
        "from hearth.store.sqlite import SQLiteStore\n"
        "try:\n"
        f"    asyncio.run(SQLiteStore({str(path)!r}).open())\n"
        "except StoreError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(3)\n"
    )
    try:
        await store.admit(new("support/c-1"))
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=60,
        )
        assert await store.append("support/c-1", [msg(1)]) == [1]  # the owner is unharmed
    finally:
        await store.close()
    assert done.returncode == 3, done.stderr
    message = done.stdout.strip()
    assert "\n" not in message
    assert "another process owns the SQLite file" in message
    assert "PostgreSQL" in message


async def test_a_second_store_of_a_file_this_process_holds_is_told_so(tmp_path: Path) -> None:
    """A second runtime on one file in one process (a notebook's earlier runtime never closed)
    was told another process owned the file."""
    store = await opened(tmp_path / "hearth.db")
    try:
        with pytest.raises(StoreError, match="is open in this process already"):
            await opened(tmp_path / "." / "hearth.db")
    finally:
        await store.close()
    again = await opened(tmp_path / "hearth.db")  # closed, it is free again
    await again.close()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


@pytest.mark.crash
async def test_committed_work_survives_a_sigkill_and_the_file_reopens_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hearth.db"
    script = (
        "import asyncio, sys, time\n"
        "from hearth.records import UserMessage\n"
        "from hearth.store import NewSubmission, SQLiteStore\n"
        "async def main():\n"
        f"    store = SQLiteStore({str(path)!r})\n"
        "    await store.open()\n"
        "    await store.admit(NewSubmission('support/c-1', 'support', 'message', {}))\n"
        "    for n in range(1, 101):\n"
        "        m = UserMessage(id=f'm{n}', message_id=f'm{n}', content='x')\n"
        "        await store.append('support/c-1', [m])\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, env=_env()
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        assert line.strip() == b"ready"
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    store = await opened(path)
    try:
        assert await store.last_offset("support/c-1") == 100
        assert len(await store.read("support/c-1")) == 101
    finally:
        await store.close()


_GIVE_UP_STARTS = """
import asyncio, sys
import anyio
import hearth.store

async def main(path):
    for n in range(60):
        store = hearth.store.open_store(f"sqlite:///{path}")
        try:
            async with asyncio.timeout(n * 0.0005):
                await store.open()
        except TimeoutError:
            pass
        await store.close()
    for n in range(60):  # an anyio scope cancels again at every await
        store = hearth.store.open_store(f"sqlite:///{path}")
        with anyio.move_on_after(n * 0.0005):
            await store.open()
        await store.close()
    store = hearth.store.open_store(f"sqlite:///{path}")
    await store.open()  # the file is free: nothing of the starts given up on holds it
    await store.close()
    print("free")

asyncio.run(main(sys.argv[1]))
"""


def test_a_start_given_up_on_frees_the_file_without_blocking_the_loop(tmp_path: Path) -> None:
    """A start cancelled while its thread opened the file (a timeout around ``app.run()``, a
    Ctrl-C during start-up) joined that thread on the event loop; the thread, having opened
    the file, served on for good: the loop blocked for ever."""
    done = subprocess.run(
        [sys.executable, "-c", _GIVE_UP_STARTS, str(tmp_path / "h.db")],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "free"), done.stderr[-2000:]


async def test_data_persists_after_close_and_reopen(tmp_path: Path) -> None:
    store = await opened(tmp_path / "hearth.db")
    admission = await store.admit(new("support/c-1"))
    await store.append("support/c-1", [msg(1)])
    await store.close()
    again = await opened(tmp_path / "hearth.db")
    try:
        assert [r.id for r in await again.read("support/c-1")] == ["support/c-1:created", "m1"]
        assert await again.get_submission(admission.submission.id) == admission.submission
    finally:
        await again.close()


async def test_the_same_store_object_can_be_reopened(tmp_path: Path) -> None:
    store = await opened(tmp_path / "hearth.db")
    await store.admit(new("support/c-1"))
    await store.close()
    await store.open()
    try:
        assert await store.last_offset("support/c-1") == 0
    finally:
        await store.close()


async def test_a_schema_1_file_is_migrated_with_the_heads_of_its_conversations(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        first = (await store.admit(new("support/c-1"))).submission
        [running] = await store.claim("owner-1", 30.0, 10)
        waiting = (await store.admit(new("support/c-1"))).submission
        other = (await store.admit(new("support/c-2"))).submission
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:  # as schema 1 left it: no heads
        _as_schema_2(conn)
        conn.execute("DROP INDEX submissions_heads")
        conn.execute("DROP INDEX submissions_claimable")
        conn.execute("ALTER TABLE submissions DROP COLUMN is_head")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.close()
    store = await opened(path)
    try:
        assert running.id == first.id
        assert [s.id for s in await store.claim("owner-2", 30.0, 10)] == [other.id]
        await store.settle(
            running.fence,
            settlement(first.id, "completed", None, ""),
            outcome="completed",
            error=None,
            reply="",
        )
        assert [s.id for s in await store.claim("owner-2", 30.0, 10)] == [waiting.id]
    finally:
        await store.close()


async def reopened_as(
    path: Path, revert: Callable[[sqlite3.Connection], None], clock: ManualClock
) -> SQLiteStore:
    """The file at ``path`` turned back by ``revert`` into what an older hearth left, opened."""
    with sqlite3.connect(path) as conn:
        revert(conn)
    conn.close()
    return await opened(path, clock=clock)


def _as_schema_9(conn: sqlite3.Connection) -> None:
    """The submissions table as schema 9 left it: no count of graceful releases (nor the
    carried writes of schema 11)."""
    conn.execute("ALTER TABLE submissions DROP COLUMN releases")
    conn.execute("ALTER TABLE submissions DROP COLUMN carried")
    conn.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")


async def test_a_schema_9_file_counts_graceful_releases_after_its_migration(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        first = (await store.admit(new("support/c-1"))).submission
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        _as_schema_9(conn)
    conn.close()
    store = await opened(path)
    try:
        assert await store.get_submission(first.id) == first  # releases 0
        (claimed,) = await store.claim("owner-1", 30.0, 1)
        assert await store.release(claimed.fence, "owner-1", graceful=True)
        row = await store.get_submission(first.id)
        assert row is not None and (row.attempt, row.releases, row.interruptions) == (1, 1, 0)
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == (str(SCHEMA_VERSION),) == ("11",)


async def test_a_claim_reads_only_heads_that_may_run_on_new_and_older_files(
    tmp_path: Path,
) -> None:
    """Waiting heads stayed in the index a claim read: each claim stepped over all of them on
    the writer thread, every other write waiting behind it."""
    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        for n in range(50):
            await store.admit(new(f"support/w-{n}"))
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE submissions SET status = 'waiting'")
        conn.execute("DROP INDEX submissions_claimable")  # as a file of an earlier release
    conn.close()
    store = await opened(path)
    try:
        await store.admit(new("support/c-1"))
        (claimed,) = await store.claim("owner-1", 30.0, 10)
        assert claimed.conversation_id == "support/c-1"
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        waiting = conn.execute(
            "SELECT count(*) FROM submissions INDEXED BY submissions_claimable"
            " WHERE is_head = 1 AND status IN ('queued', 'running')"
        ).fetchone()
    conn.close()
    assert waiting == (1,)  # the running one; none of the 50 waiting heads


async def test_one_conversations_pending_waits_are_found_through_its_key(
    tmp_path: Path,
) -> None:
    """With both forms in one statement, SQLite walked every pending wait of the database
    for one conversation's (``GET /agents/{agent}/{id}/waits``)."""
    store = await opened(tmp_path / "hearth.db")
    try:
        conn = store._writer._conn
        assert conn is not None
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        await store.list_waits("support/c-1")
        await store.list_waits()
        conn.set_trace_callback(None)
        one, every = [q for q in statements if "FROM waits" in q]
        plans = [
            " | ".join(str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {q}"))
            for q in (one, every)
        ]
    finally:
        await store.close()
    assert "(conversation_id=?)" in plans[0], plans[0]
    assert "waits_pending" in plans[1], plans[1]


def _as_schema_8(conn: sqlite3.Connection) -> None:
    """The conversations table as schema 8 left it: the list's indexes on last_activity."""
    _as_schema_9(conn)
    conn.execute("DROP TRIGGER conversations_bucket_on_insert")
    conn.execute("DROP TRIGGER conversations_bucket_on_update")
    conn.execute("DROP INDEX conversations_recent")
    conn.execute("DROP INDEX conversations_recent_by_agent")
    conn.execute("ALTER TABLE conversations DROP COLUMN activity_bucket")
    conn.execute(
        "CREATE INDEX conversations_by_activity ON conversations (last_activity, conversation_id)"
    )
    conn.execute(
        "CREATE INDEX conversations_by_agent"
        " ON conversations (agent, last_activity, conversation_id)"
    )
    conn.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")


def _as_schema_2(conn: sqlite3.Connection) -> None:
    _as_schema_8(conn)
    conn.execute("DROP INDEX conversations_by_activity")
    conn.execute("DROP INDEX conversations_by_agent")
    conn.execute("ALTER TABLE conversations DROP COLUMN last_activity")
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")


async def test_a_schema_2_file_is_migrated_with_the_last_activity_of_its_conversations(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path, clock=clock)
    try:
        clock.set(1000.0)
        await store.admit(new("support/old"))
        clock.set(2000.0)
        await store.admit(new("support/new"))
        clock.set(3000.0)
        await store.claim("owner-1", 30.0, 10)  # started_at 3000 for both
        clock.set(4000.0)
        await store.admit(new("support/idle-new"))
    finally:
        await store.close()
    store = await reopened_as(path, _as_schema_2, clock)
    try:
        listed = await store.list_conversations()
        assert [(c.conversation_id, c.last_activity) for c in listed] == [
            ("support/idle-new", 4000.0),
            ("support/old", 3000.0),
            ("support/new", 3000.0),
        ]
    finally:
        await store.close()


async def test_a_schema_8_file_lists_through_activity_buckets_after_its_migration(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path, clock=clock)
    try:
        for n, at in enumerate([1000.0, 1009.5, 1010.0, 2000.25]):
            clock.set(at)
            await store.admit(new(f"support/c-{n}"))
    finally:
        await store.close()
    store = await reopened_as(path, _as_schema_8, clock)
    try:
        page = await store.list_conversations(before=(2000.25, "support/c-3"), limit=2)
        assert [c.conversation_id for c in page] == ["support/c-2", "support/c-1"]
        clock.set(3000.0)
        await store.append("support/c-0", [msg(1)])  # the trigger moves it to a new bucket
        listed = await store.list_conversations()
        assert [c.conversation_id for c in listed] == [f"support/c-{n}" for n in (0, 3, 2, 1)]
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        buckets = dict(conn.execute("SELECT conversation_id, activity_bucket FROM conversations"))
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(conversations)")}
    conn.close()
    assert buckets == {
        "support/c-0": 300,
        "support/c-1": 100,
        "support/c-2": 101,
        "support/c-3": 200,
    }
    assert {"conversations_recent", "conversations_recent_by_agent"} <= indexes
    assert not indexes & {"conversations_by_activity", "conversations_by_agent"}


async def test_a_schema_5_file_gains_the_columns_of_durable_waits(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        first = (await store.admit(new("support/c-1"))).submission
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:  # as schema 5 left it: no waits
        conn.execute("DROP TABLE waits")
        conn.execute("ALTER TABLE submissions DROP COLUMN waits")
        conn.execute("ALTER TABLE submissions DROP COLUMN waiting_since")
        conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    conn.close()
    store = await opened(path)
    try:
        sub = await store.get_submission(first.id)
        assert sub is not None and sub.waits == 0 and sub.waiting_since is None
        assert await store.list_waits() == []
    finally:
        await store.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path)
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
        )
    conn.close()
    newer = (
        rf"newer hearth \(schema {SCHEMA_VERSION + 1}; this hearth knows schema {SCHEMA_VERSION}\)"
    )
    with pytest.raises(SchemaTooNew, match=newer):
        await opened(path)


async def test_a_schema_4_file_gets_the_traceparent_column(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        old = (await store.admit(new("support/c-1"))).submission
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:  # as schema 4 left it: no traceparent
        conn.execute("ALTER TABLE submissions DROP COLUMN traceparent")
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.close()
    store = await opened(path)
    try:
        assert (await store.get_submission(old.id)).traceparent is None  # type: ignore[union-attr]
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        fresh = NewSubmission("support/c-2", "support", "message", {"t": 1}, traceparent=parent)
        admitted = (await store.admit(fresh)).submission
        assert (await store.get_submission(admitted.id)).traceparent == parent  # type: ignore[union-attr]
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == (str(SCHEMA_VERSION),)


async def test_a_schema_3_file_gains_sources_deliveries_and_schedules(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        old = (await store.admit(new("support/c-1"))).submission
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:  # as schema 3 left it
        conn.execute("ALTER TABLE submissions DROP COLUMN source")
        conn.execute("ALTER TABLE submissions DROP COLUMN traceparent")
        conn.execute("DROP TABLE deliveries")
        conn.execute("DROP TABLE schedules")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
    store = await opened(path)
    try:
        assert (await store.get_submission(old.id)) == old
        cursor = await store.open_schedule("daily", "0 9 * * *|UTC", 10.0)
        assert cursor.cursor == 10.0
        assert await store.list_deliveries("hooks") == []
    finally:
        await store.close()


async def test_a_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    path.write_bytes(b"this is not a database file, not at all" * 100)
    with pytest.raises(StoreError, match="cannot open the SQLite file"):
        await opened(path)


async def test_the_file_uses_wal_with_exclusive_locking_and_full_sync(tmp_path: Path) -> None:
    store = await opened(tmp_path / "hearth.db")

    def pragmas(conn: sqlite3.Connection, _: Any) -> tuple[Any, ...]:
        return tuple(
            conn.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("journal_mode", "locking_mode", "synchronous")
        )

    try:
        assert await store._writer.call(pragmas, write=False) == ("wal", "exclusive", 2)
    finally:
        await store.close()


async def test_reading_from_an_offset_is_a_primary_key_range_scan() -> None:
    store = await opened(":memory:")

    def plan(conn: sqlite3.Connection, _: Any) -> str:
        rows = conn.execute(
            "EXPLAIN QUERY PLAN SELECT body FROM records WHERE conversation_id = ?"
            ' AND "offset" > ? ORDER BY "offset" LIMIT ?',
            ("c", 5, 10),
        ).fetchall()
        return " | ".join(str(row[3]) for row in rows)

    try:
        detail = await store._writer.call(plan, write=False)
    finally:
        await store.close()
    assert "SEARCH records USING INDEX sqlite_autoindex_records_1" in detail
    assert "offset>?" in detail
    assert "TEMP B-TREE" not in detail


async def test_the_lookups_by_type_use_the_partial_type_index() -> None:
    """Only compactions and settlements are indexed by type, each in a partial index of its own
    (a step's record writes one index fewer); the queries that look them up use those."""
    from hearth.store import sqlite_ops

    store = await opened(":memory:")

    def plans(conn: sqlite3.Connection, _: Any) -> list[str]:
        queries = [
            (
                "SELECT body FROM records WHERE conversation_id = ? AND type = 'compaction'"
                ' ORDER BY "offset" DESC LIMIT 1',
                ("c",),
            ),
            (sqlite_ops._SETTLEMENTS, {"c": "c"}),
            (sqlite_ops._SUBMISSION_SPANS, {"c": "c"}),
        ]
        return [
            " | ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {q}", p))
            for q, p in queries
        ]

    def index_sql(conn: sqlite3.Connection, _: Any) -> str:
        row = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'records_by_type'"
        ).fetchone()
        return str(None if row is None else row[0])

    try:
        found = await store._writer.call(plans, write=False)
        sql = await store._writer.call(index_sql, write=False)
    finally:
        await store.close()
    assert "INDEX records_compactions" in found[0], found
    assert all("INDEX records_settlements" in plan for plan in found[1:]), found
    assert sql == "None"  # the index over every record's type is gone


async def test_a_schema_7_file_gets_the_partial_type_indexes(tmp_path: Path) -> None:
    from hearth.records import Compaction

    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        await store.admit(new("support/c-1"))
        await store.append("support/c-1", [msg(1)])
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:  # as schema 7 left it: every record in one type index
        conn.execute("DROP INDEX records_compactions")
        conn.execute("DROP INDEX records_settlements")
        conn.execute('CREATE INDEX records_by_type ON records (conversation_id, type, "offset")')
        conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    conn.close()
    store = await opened(path)
    try:
        found = await store.last_of_type("support/c-1", "user_message")
        assert found is not None and (found.id, found.offset) == ("m1", 1)
        assert await store.last_of_type("support/c-1", Compaction.type) is None
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert "records_by_type" not in names
    assert {"records_compactions", "records_settlements"} <= names
    assert version == (str(SCHEMA_VERSION),)


# --- lifecycle -------------------------------------------------------------------------------


async def test_close_is_idempotent_and_later_operations_fail() -> None:
    store = await opened(":memory:")
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        await store.last_offset("support/c-1")


async def test_operations_before_open_fail() -> None:
    with pytest.raises(StoreError, match="not open"):
        await SQLiteStore(":memory:").read("support/c-1")


async def test_close_finishes_the_work_already_queued(tmp_path: Path) -> None:
    store = await opened(tmp_path / "hearth.db")
    await store.admit(new("support/c-1"))
    store.pause_writer()
    pending = asyncio.create_task(store.append("support/c-1", [msg(1)]))
    await until_submitted(store, 2)
    await store.close()
    assert await pending == [1]


def test_the_sqlite_store_implements_the_store_interface() -> None:
    assert isinstance(SQLiteStore(":memory:"), Store)


def test_an_unknown_synchronous_mode_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="synchronous"):
        SQLiteStore(":memory:", synchronous="sometimes")


# --- group commit ----------------------------------------------------------------------------


async def test_appends_queued_together_share_one_commit() -> None:
    store = await opened(":memory:")
    try:
        conversations = [f"support/c-{n}" for n in range(10)]
        for conversation_id in conversations:
            await store.admit(new(conversation_id))
        commits, submitted = store.commits, store.submitted
        store.pause_writer()
        appends = [asyncio.create_task(store.append(c, [msg(1)])) for c in conversations]
        await until_submitted(store, submitted + 10)
        store.resume_writer()
        assert await asyncio.gather(*appends) == [[1]] * 10
        assert store.commits - commits == 1
    finally:
        await store.close()


async def test_a_group_that_succeeds_runs_without_savepoints() -> None:
    """Savepoints (two statements per operation) are only for a group in which one fails."""
    store = await opened(":memory:")
    try:
        conversations = [f"support/c-{n}" for n in range(10)]
        for conversation_id in conversations:
            await store.admit(new(conversation_id))
        seen: list[str] = []
        await store._write(lambda conn, _: conn.set_trace_callback(seen.append))
        submitted = store.submitted
        store.pause_writer()
        appends = [asyncio.create_task(store.append(c, [msg(1)])) for c in conversations]
        await until_submitted(store, submitted + 10)
        store.resume_writer()
        assert await asyncio.gather(*appends) == [[1]] * 10
        await store._write(lambda conn, _: conn.set_trace_callback(None))
        assert not [s for s in seen if s.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK"))]
        assert sum(s == "COMMIT" for s in seen) == 2  # the group's, and the one that set the trace
    finally:
        await store.close()


async def test_concurrent_appends_need_no_more_commits_than_appends(tmp_path: Path) -> None:
    store = await opened(tmp_path / "hearth.db")
    try:
        conversations = [f"support/c-{n}" for n in range(50)]
        await asyncio.gather(*(store.admit(new(c)) for c in conversations))
        commits = store.commits
        await asyncio.gather(*(store.append(c, [msg(1)]) for c in conversations))
        assert store.commits - commits <= len(conversations)
        assert store.ops >= 100
    finally:
        await store.close()


def on_thread(conn: sqlite3.Connection, _: object) -> int:
    return threading.get_ident()


async def test_a_lone_operation_runs_on_the_event_loop_and_commits_before_it_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hand-off to the writer thread and back when nothing else is asked for."""
    monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", 60.0)  # a busy machine's commits too
    store = await opened(tmp_path / "hearth.db")
    try:
        await store.admit(new("support/c-1"))
        commits, inline = store.commits, store._writer.inline
        assert await store._writer.call(on_thread, write=True) == threading.get_ident()
        assert await store.append("support/c-1", [msg(1)]) == [1]
        assert await store.read("support/c-1", after=0) != []
        assert store._writer.inline - inline == 3
        assert store.commits - commits == 2  # the two writes; the read commits nothing
        in_transaction = await store._writer.call(lambda conn, _: conn.in_transaction, write=False)
        assert in_transaction is False
    finally:
        await store.close()
    reopened = await opened(tmp_path / "hearth.db")
    try:
        assert await reopened.last_offset("support/c-1") == 1
    finally:
        await reopened.close()


async def test_a_lone_operation_with_nothing_else_due_runs_at_once_and_others_still_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asked for while nothing else of the loop is due, an operation runs (and commits) in the
    call itself: its caller waits one turn of the loop, not two. Asked for beside others due in
    the same iteration, operations still wait for its end and share one commit."""
    monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", 60.0)  # a busy machine's commits too
    store = await opened(":memory:")
    try:
        conversations = [f"support/c-{n}" for n in range(5)]
        for conversation_id in conversations:
            await store.admit(new(conversation_id))
        alone, commits = store._writer.alone, store.commits
        assert await store.append("support/c-1", [msg(1)]) == [1]
        assert (store._writer.alone - alone, store.commits - commits) == (1, 1)
        with pytest.raises(StoreError, match="does not exist"):
            await store.append("support/c-9", [msg(1)])  # its error reaches its caller
        assert store._writer.alone - alone == 2
        alone, commits = store._writer.alone, store.commits
        await asyncio.gather(*(store.append(c, [msg(2)]) for c in conversations))
        assert (store._writer.alone - alone, store.commits - commits) == (0, 1)
    finally:
        await store.close()


async def test_a_caller_appending_in_a_loop_still_lets_the_others_timers_fire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Answered without a turn of the loop, a caller that appends in a loop yields to it now
    and then: another task's timer fires while it goes on, not after it."""
    monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", 60.0)
    store = await opened(":memory:")
    try:
        await store.admit(new("support/c-1"))
        appended: list[int] = []
        seen: list[int] = []

        async def timer() -> None:
            await asyncio.sleep(0.002)
            seen.append(len(appended))

        ticking = asyncio.ensure_future(timer())
        await asyncio.sleep(0)  # (its sleep has begun)
        alone = store._writer.alone
        for n in range(1, 2001):
            await store.append("support/c-1", [msg(n)])
            appended.append(n)
        assert store._writer.alone - alone > 1000  # (mostly answered at once)
        await ticking
        assert seen and seen[0] < 2000
    finally:
        await store.close()


async def test_a_caller_whose_writes_fail_in_a_loop_still_yields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error answered at once returned before the loop's turn: a caller retrying a failing
    write froze the process (its own timeout never fired, nor anyone's timers)."""
    monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", 60.0)
    store = await opened(":memory:")
    try:
        failed = 0
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                while True:
                    try:
                        await store.append("support/nowhere", [msg(1)])
                    except StoreError:
                        failed += 1
        assert failed > 10 and store._writer.alone >= failed - 1
    finally:
        await store.close()


async def test_a_whole_stream_is_read_on_the_writer_thread_never_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot of a 100,000-record conversation was decoded on the event loop (run inline,
    as small reads are): every other request of the process waited over a second."""
    monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", 60.0)
    store = await opened(tmp_path / "hearth.db")
    try:
        await store.admit(new("support/c-1"))
        await store.append("support/c-1", [msg(n) for n in range(1, 50)])
        inline = store._writer.inline
        admitted = asyncio.ensure_future(store.admit(new("support/c-2")))
        for _ in range(100):  # asked for first: collected to run at the iteration's end
            if store._writer._collected:
                break
            await asyncio.sleep(0)
        assert store._writer._collected
        whole = await store.read("support/c-1")
        assert [r.offset for r in whole] == list(range(50))
        assert store._writer.inline == inline  # neither ran on the loop
        await admitted
        inline = store._writer.inline
        assert len(await store.read("support/c-1", after=40)) == 9  # a tail: inline
        assert store._writer.inline == inline + 1
    finally:
        await store.close()


async def test_operations_asked_for_in_one_loop_iteration_share_one_commit_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without pausing the writer: the first of them does not run (and commit) alone."""
    monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", 60.0)  # a busy machine's commits too
    store = await opened(":memory:")
    try:
        conversations = [f"support/c-{n}" for n in range(10)]
        for conversation_id in conversations:
            await store.admit(new(conversation_id))
        commits, inline = store.commits, store._writer.inline
        threads = await asyncio.gather(
            *(store._writer.call(on_thread, write=True) for _ in conversations)
        )
        assert set(threads) == {threading.get_ident()}
        assert store.commits - commits == 1
        assert store._writer.inline - inline == 1
    finally:
        await store.close()


async def test_after_a_slow_commit_the_thread_takes_the_groups_until_a_commit_is_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that syncs slowly must not hold the event loop: the commit after a slow one runs
    on the writer thread; once commits are fast again, groups come back to the loop."""
    monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", 60.0)  # the admission's commit is fast
    store = await opened(tmp_path / "hearth.db")
    try:
        await store.admit(new("support/c-1"))
        writer_thread = store._writer._thread.ident  # type: ignore[union-attr]
        monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", -1.0)  # every commit is slow now
        assert await store._writer.call(on_thread, write=True) == threading.get_ident()
        together = [store._writer.call(on_thread, write=True) for _ in range(3)]
        assert set(await asyncio.gather(*together)) == {writer_thread}
        assert await store._writer.call(on_thread, write=True) == writer_thread
        monkeypatch.setattr(sqlite_writer, "SLOW_COMMIT_S", 60.0)
        assert await store._writer.call(on_thread, write=True) == writer_thread  # fast, on it
        assert await store._writer.call(on_thread, write=True) == threading.get_ident()
        assert await store.append("support/c-1", [msg(1)]) == [1]
    finally:
        await store.close()


class HeldQueue(queue.SimpleQueue):  # type: ignore[type-arg]
    """The writer's queue, with a hold: the thread takes an item, then waits for ``go``."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.go.set()
        self.taken = threading.Event()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        self.taken.set()
        self.go.wait()
        return item


async def test_a_lone_operation_waits_its_turn_behind_work_handed_to_the_thread() -> None:
    """Taken by the thread but not yet run (no lock held, the writer not paused), an earlier
    operation of this loop still runs before a later lone one."""
    store = SQLiteStore(":memory:")
    held = store._writer._queue = HeldQueue()
    await store.open()
    try:
        for n in range(2):
            await store.admit(new(f"support/c-{n}"))
        order: list[str] = []

        def first(conn: sqlite3.Connection, _: object) -> None:
            order.append("first")

        def second(conn: sqlite3.Connection, _: object) -> int:
            order.append("second")
            return threading.get_ident()

        held.go.clear()
        held.taken.clear()
        store._writer._slow = True  # as after a slow commit: the two go to the thread
        early = asyncio.gather(*(store._writer.call(first, write=True) for _ in range(2)))
        await asyncio.to_thread(held.taken.wait, 5)  # the thread holds the first of the two
        store._writer._slow = False  # commits are fast again: only the queue holds `late` back
        late = asyncio.create_task(store._writer.call(second, write=True))
        for _ in range(5):
            await asyncio.sleep(0)
        assert order == [] and not late.done()  # not run on the loop ahead of the two
        held.go.set()
        await early
        assert await late != threading.get_ident()
        assert order == ["first", "first", "second"]
    finally:
        held.go.set()
        await store.close()


async def test_operations_from_another_event_loop_run_on_the_writer_thread() -> None:
    store = await opened(":memory:")
    try:
        await store.admit(new("support/c-1"))
        home = threading.get_ident()

        async def elsewhere() -> tuple[int, list[int]]:
            thread = await store._writer.call(on_thread, write=True)
            return thread, await store.append("support/c-1", [msg(1)])

        thread, offsets = await asyncio.to_thread(asyncio.run, elsewhere())
        assert thread not in (home, threading.get_ident()) and offsets == [1]
        assert await store.last_offset("support/c-1") == 1
    finally:
        await store.close()


async def test_a_lone_failing_write_on_the_loop_leaves_nothing_and_the_store_goes_on() -> None:
    store = await opened(":memory:")
    try:
        await store.admit(new("support/c-1"))
        await store.append("support/c-1", [msg(1)])
        inline = store._writer.inline
        with pytest.raises(IntegrityError):
            await store.append("support/c-1", [msg(2), msg(1, "changed")])
        assert store._writer.inline - inline == 1
        assert await store.last_offset("support/c-1") == 1
        assert await store.append("support/c-1", [msg(2)]) == [2]
    finally:
        await store.close()


async def test_a_failing_operation_fails_alone_within_its_group() -> None:
    store = await opened(":memory:")
    try:
        for n in range(3):
            await store.admit(new(f"support/c-{n}"))
        await store.append("support/c-1", [msg(1)])
        commits, submitted = store.commits, store.submitted
        store.pause_writer()
        good_before = asyncio.create_task(store.append("support/c-0", [msg(1)]))
        bad = asyncio.create_task(store.append("support/c-1", [msg(2), msg(1, "changed")]))
        good_after = asyncio.create_task(store.append("support/c-2", [msg(1)]))
        await until_submitted(store, submitted + 3)
        store.resume_writer()
        assert await good_before == [1]
        assert await good_after == [1]
        with pytest.raises(IntegrityError):
            await bad
        assert store.commits - commits == 1
        assert await store.last_offset("support/c-1") == 1
    finally:
        await store.close()


async def test_a_failed_transaction_fails_every_operation_of_its_group() -> None:
    store = await opened(":memory:")
    try:
        await store.admit(new("support/c-0"))
        submitted = store.submitted
        store.pause_writer()
        append = asyncio.create_task(store.append("support/c-0", [msg(1)]))

        def sabotage(conn: sqlite3.Connection, _: Any) -> None:
            conn.execute("ROLLBACK")  # ends the group's transaction under its feet

        broken = asyncio.create_task(store._writer.call(sabotage, write=True))
        await until_submitted(store, submitted + 2)
        store.resume_writer()
        for task in (append, broken):
            with pytest.raises(StoreError, match="rolled back"):
                await task
        assert await store.last_offset("support/c-0") == 0
        assert await store.append("support/c-0", [msg(1)]) == [1]
    finally:
        await store.close()


async def test_a_cancelled_caller_does_not_undo_its_write() -> None:
    store = await opened(":memory:")
    try:
        await store.admit(new("support/c-0"))
        store.pause_writer()
        append = asyncio.create_task(store.append("support/c-0", [msg(1)]))
        await asyncio.sleep(0)
        append.cancel()
        store.resume_writer()
        with pytest.raises(asyncio.CancelledError):
            await append
        assert await store.last_offset("support/c-0") == 1
    finally:
        await store.close()


# --- URLs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path", "synchronous"),
    [
        (None, "./hearth.db", "FULL"),
        ("memory", ":memory:", "FULL"),
        ("sqlite:///relative.db", "relative.db", "FULL"),
        ("sqlite:////abs/path.db", "/abs/path.db", "FULL"),
        ("sqlite://relative.db", "relative.db", "FULL"),
        ("sqlite://data/hearth.db?synchronous=normal", "data/hearth.db", "NORMAL"),
        ("sqlite://:memory:", ":memory:", "FULL"),
        ("some/dir/app.db", "some/dir/app.db", "FULL"),
    ],
)
def test_open_store_maps_urls_to_sqlite_files(url: str | None, path: str, synchronous: str) -> None:
    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    assert (store.path, store.synchronous) == (path, synchronous)


@pytest.mark.parametrize(
    "url", ["mysql://localhost/db", "", "sqlite://", "sqlite:///", "sqlite://x.db?y=1"]
)
def test_open_store_refuses_other_urls(url: str) -> None:
    with pytest.raises(ConfigurationError):
        open_store(url)


def test_the_sqlite_clock_does_not_follow_a_wall_clock_jump(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = SQLiteStore(":memory:")
    before = store.clock()
    monkeypatch.setattr(time, "time", lambda: before + 3600.0)  # the wall clock jumps an hour
    assert 0 <= store.clock() - before < 1.0


async def test_a_page_counts_the_open_work_of_its_own_rows_only(tmp_path: Path) -> None:
    """The count of each row's open submissions ran for every row of the buckets the page
    reached, before the sort: a first page among 100,000 conversations active within the same
    ten seconds took 142 ms. It is counted for the page's rows, after its LIMIT."""
    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        for n in range(5):
            await store.admit(new(f"support/c-{n}"))
        page = await store.list_conversations(limit=3)
        assert [c.conversation_id for c in page] == [f"support/c-{n}" for n in (4, 3, 2)]
        assert [c.unsettled for c in page] == [1, 1, 1]
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        sql = rules.conversation_list_sql(False, None, False, lambda n: f":{n}")
        plan = [(r[0], r[1], r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", {"limit": 3})]
    conn.close()
    scan_page = next(node for node, _, text in plan if text == "SCAN p")
    counting = next(parent for _, parent, text in plan if "CORRELATED SCALAR SUBQUERY" in text)
    assert counting == 0 and scan_page < next(
        node for node, _, text in plan if "CORRELATED SCALAR SUBQUERY" in text
    ), plan


async def test_a_page_of_100000_conversations_is_read_through_an_index(tmp_path: Path) -> None:
    """Every form of the list query walks an index in its order: no sort of all rows."""
    path = tmp_path / "hearth.db"
    store = await opened(path)
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO conversations (conversation_id, agent, parent, last_offset, created_at,"
            " last_activity) VALUES (?, ?, NULL, 0, ?, ?)",
            ((f"{'ab'[n % 2]}/c-{n}", "ab"[n % 2], float(n), float(n)) for n in range(100_000)),
        )
        conn.execute("ANALYZE")
        for agent in (False, True):
            for status in (None, "active", "idle"):
                for before in (False, True):
                    sql = rules.conversation_list_sql(agent, status, before, lambda n: f":{n}")
                    args = {"agent": "a", "b": 5000, "t": 5e4, "c": "a/c-50000", "limit": 51}
                    plan = " | ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))
                    assert "USING INDEX conversations_recent" in plan, plan
                    if status == "active":
                        # A window of the newest, in index order; then (a page it did not
                        # fill) the open submissions, each conversation found by its key.
                        assert f"LIMIT {rules.ACTIVE_WINDOW})" in sql
                        exact = rules.active_conversations_sql(agent, before, lambda n: f":{n}")
                        plan = " | ".join(
                            r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {exact}", args)
                        )
                        assert "SEARCH s USING INDEX submissions_by_status" in plan, plan
                        assert "SEARCH c USING INDEX sqlite_autoindex_conversations_1" in plan
                        assert "SCAN c" not in plan, plan
                    else:
                        # Only the rows of the buckets a page reaches are sorted, never all rows.
                        assert "TEMP B-TREE FOR ORDER BY" not in plan, plan
    conn.close()
    store = await opened(path)
    try:
        page = await store.list_conversations("b", before=(60001.0, "b/c-60001"), limit=3)
        assert [c.conversation_id for c in page] == ["b/c-59999", "b/c-59997", "b/c-59995"]
    finally:
        await store.close()


async def test_a_schema_6_file_gains_the_attachment_store(tmp_path: Path) -> None:
    import hashlib

    from hearth.store import Blob

    path = tmp_path / "hearth.db"
    store = await opened(path)
    try:
        first = (await store.admit(new("support/c-1"))).submission
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:  # as schema 6 left it: no attachment tables
        conn.execute("DROP TABLE attachments")
        conn.execute("DROP TABLE attachment_refs")
        conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    conn.close()
    data = b"bytes after the upgrade"
    b = Blob(hashlib.sha256(data).hexdigest(), "text/plain", len(data), data)
    store = await opened(path)
    try:
        assert await store.get_submission(first.id) == first
        await store.admit(NewSubmission("support/c-2", "support", "message", {"t": 1}, blobs=(b,)))
        got = await store.get_attachment(b.sha256)
        assert got is not None and got.data == data
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == (str(SCHEMA_VERSION),) == ("11",)


async def test_opening_without_create_refuses_a_file_that_is_not_hearths(tmp_path: Path) -> None:
    missing, foreign = tmp_path / "typo.db", tmp_path / "other.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    for path in (missing, foreign):
        with pytest.raises(StoreError, match=r"no database at|no hearth database"):
            await SQLiteStore(str(path)).open(create=False)
    assert not missing.exists()
    with sqlite3.connect(foreign) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert tables == {"notes"}  # nothing of hearth's was made in it


# --- forks in chunks ---------------------------------------------------------------------------


async def long_conversation(store: SQLiteStore, records: int) -> int:
    """``support/long``: one settled submission with ``records`` messages; its last offset."""
    sub = (await store.admit(new("support/long"))).submission
    (claimed,) = await store.claim("owner", 300, 1)
    for start in range(0, records, 100):
        batch = [msg(n) for n in range(start, min(start + 100, records))]
        await store.append("support/long", batch, fence=claimed.fence)
    done = settlement(sub.id, "completed", None, "ok")
    return await store.settle(claimed.fence, done, outcome="completed", error=None, reply="ok")


@pytest.fixture
async def long_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[SQLiteStore, int]]:
    """A store holding ``support/long`` (46 records at rest), forked 10 records a job."""
    monkeypatch.setattr(sqlite_ops, "FORK_CHUNK", 10)
    store = await opened(tmp_path / "hearth.db")
    try:
        yield store, await long_conversation(store, 45)
    finally:
        await store.close()


async def test_a_long_fork_lets_other_writes_commit_between_its_chunks(
    long_store: tuple[SQLiteStore, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork of 100,000 records copied in one job of the writer held every other write (steps,
    admissions, heartbeats) for 2.5 s; it copies ``FORK_CHUNK`` records a job."""
    store, end = long_store
    await store.admit(new("support/other"))
    seen: list[int] = []  # the other conversation's end, as each chunk finds it
    copy = sqlite_ops.fork_copy

    def watched(conn: sqlite3.Connection, outbox: Any, **chunk: Any) -> None:
        seen.append(sqlite_ops.last_offset(conn, "support/other"))
        copy(conn, outbox, **chunk)

    monkeypatch.setattr(sqlite_ops, "fork_copy", watched)
    fork = asyncio.create_task(store.fork("support/long", end, "support/copy"))
    for n in range(5):
        await store.append("support/other", [msg(n)])
    info = await fork
    assert len(seen) == 5  # 46 records after conversation_created: 10 a chunk
    assert seen[-1] > seen[0], seen  # other writes committed while the fork was copying
    assert info.last_offset == end
    copied = await store.read("support/copy")
    source = await store.read("support/long")
    assert [r.offset for r in copied] == list(range(end + 1))
    assert [r.type for r in copied[1:]] == [r.type for r in source[1:]]
    assert copied[-1].id == f"support/copy:copy:{end}"


async def test_a_fork_stopped_half_way_leaves_no_conversation_and_the_next_one_is_whole(
    long_store: tuple[SQLiteStore, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, end = long_store
    copy = sqlite_ops.fork_copy
    calls: list[int] = []

    def failing(conn: sqlite3.Connection, outbox: Any, **chunk: Any) -> None:
        calls.append(chunk["after"])
        if len(calls) == 3:
            raise sqlite3.OperationalError("disk I/O error")  # (a crash between two chunks)
        copy(conn, outbox, **chunk)

    monkeypatch.setattr(sqlite_ops, "fork_copy", failing)
    with pytest.raises(StoreError, match="disk I/O error"):
        await store.fork("support/long", end, "support/copy")
    # Twenty copies are on disk under the id, but no conversation is, and no reader sees them.
    assert await store.get_conversation("support/copy") is None
    assert await store.read("support/copy") == []
    assert await store.read_page("support/copy", -1, 100, 1 << 20) == ([], False)
    listed = {c.conversation_id for c in await store.list_conversations()}
    assert "support/copy" not in listed
    monkeypatch.setattr(sqlite_ops, "fork_copy", copy)
    await store.fork("support/long", end, "support/copy")
    assert [r.offset for r in await store.read("support/copy")] == list(range(end + 1))
    # The id of a fork that stopped can also be taken by a new conversation: a clean one.
    monkeypatch.setattr(sqlite_ops, "fork_copy", failing)
    calls.clear()
    with pytest.raises(StoreError):
        await store.fork("support/long", end, "support/fresh")
    await store.admit(new("support/fresh"))
    assert [r.type for r in await store.read("support/fresh")] == ["conversation_created"]


async def test_a_conversation_created_while_it_is_forked_to_stops_the_fork(
    long_store: tuple[SQLiteStore, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, end = long_store
    copy = sqlite_ops.fork_copy
    admitted: list[asyncio.Task[Any]] = []
    loop = asyncio.get_running_loop()

    def admit() -> None:
        admitted.append(asyncio.ensure_future(store.admit(new("support/copy"))))

    def meanwhile(conn: sqlite3.Connection, outbox: Any, **chunk: Any) -> None:
        copy(conn, outbox, **chunk)
        if chunk["after"] == 0:  # an admission to the same id, queued behind this chunk
            queued = store.submitted
            loop.call_soon_threadsafe(admit)
            for _ in range(5000):
                if store.submitted > queued:
                    break
                time.sleep(0.001)

    monkeypatch.setattr(sqlite_ops, "fork_copy", meanwhile)
    with pytest.raises(hearth.errors.ConversationExists):
        await store.fork("support/long", end, "support/copy")
    await admitted[0]
    # The conversation the admission made holds none of the fork's copies.
    assert [r.type for r in await store.read("support/copy")] == ["conversation_created"]
    # Two forks to one id at once: the second is refused while the first copies.
    monkeypatch.setattr(sqlite_ops, "fork_copy", copy)
    first = asyncio.create_task(store.fork("support/long", end, "support/twice"))
    await asyncio.sleep(0)
    with pytest.raises(hearth.errors.ConversationExists, match="being forked"):
        await store.fork("support/long", end, "support/twice")
    assert (await first).last_offset == end
