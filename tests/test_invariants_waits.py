"""The invariant checker's rules for durable waits, each proven by a fault planted into a real
SQLite file; a run left waiting, and one resolved to the end, report nothing."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import waitapp

import hearth
from hearth.records import Record, WaitResolved
from hearth.store import open_store
from hearth.testing import invariants as inv
from hearth.testing.invariants import check_invariants

pytestmark = pytest.mark.anyio
CONV = "cashier/c-1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def run_until_waiting(path: Path, *, resolve: bool = False) -> None:
    app = hearth.App(waitapp.AGENTS, db=str(path), providers=waitapp.MODELS)
    async with app.run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "refund 250")
        end = time.monotonic() + 10
        while (await rt.submission(receipt.submission_id)).status != "waiting":
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        if resolve:
            [wait] = await rt.waits()
            await rt.resolve("cashier", "c-1", wait.wait_id, True)
            await rt.read(receipt, timeout=10)


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    """A run left waiting for its approval."""
    path = tmp_path / "h.db"
    await run_until_waiting(path)
    return path


async def rules(db: Path, *, at_rest: bool = True) -> set[str]:
    store = open_store(str(db))
    await store.open()
    try:
        return {v.rule for v in await check_invariants(store, at_rest=at_rest)}
    finally:
        await store.close()


@contextmanager
def sql(db: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(db)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def records(db: Path) -> list[dict[str, Any]]:
    with sql(db) as conn:
        rows = conn.execute(
            'SELECT body FROM records WHERE conversation_id = ? ORDER BY "offset"', (CONV,)
        )
        return [json.loads(body) for (body,) in rows]


def plant(db: Path, record: Record) -> None:
    at = len(records(db))
    body, digest = record.encode(at)
    with sql(db) as conn:
        conn.execute(
            'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body,'
            " digest) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (CONV, at, record.id, record.type, record.submission_id, body, digest),
        )
        conn.execute(
            "UPDATE conversations SET last_offset = ? WHERE conversation_id = ?", (at, CONV)
        )


def started(db: Path) -> dict[str, Any]:
    return next(r for r in records(db) if r["type"] == "wait_started")


async def test_a_run_left_waiting_has_no_violation(db: Path) -> None:
    assert await rules(db) == set()


async def test_a_run_resolved_to_the_end_has_no_violation(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    await run_until_waiting(path, resolve=True)
    assert await rules(path) == set()


async def test_a_wait_ended_twice_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    await run_until_waiting(path, resolve=True)
    wait = started(path)
    plant(
        path,
        WaitResolved(
            id="again", submission_id=wait["submission_id"], attempt=2, wait_id=wait["wait_id"]
        ),
    )
    found = await rules(path)
    assert inv.WAIT_ENDED_ONCE in found


async def test_a_wait_ended_without_starting_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    await run_until_waiting(path, resolve=True)
    sid = started(path)["submission_id"]
    plant(path, WaitResolved(id="stray", submission_id=sid, attempt=2, wait_id="w_never"))
    assert inv.WAIT_ENDED_ONCE in await rules(path)


async def test_a_waiting_submission_without_an_open_wait_is_caught(db: Path) -> None:
    wait = started(db)  # its end is recorded, yet the row still waits: nothing would resume it
    sid = wait["submission_id"]
    plant(db, WaitResolved(id="end", submission_id=sid, attempt=1, wait_id=wait["wait_id"]))
    assert await rules(db) == {inv.WAITING_HAS_OPEN_WAIT}


async def test_a_waiting_submission_holding_a_lease_is_caught(db: Path) -> None:
    with sql(db) as conn:
        conn.execute("UPDATE submissions SET lease_owner = 'ghost', lease_expires_at = 1e12")
    assert await rules(db) == {inv.WAITING_HAS_OPEN_WAIT}


async def test_an_open_wait_of_a_submission_that_does_not_wait_is_caught(db: Path) -> None:
    with sql(db) as conn:
        conn.execute("UPDATE submissions SET status = 'queued'")
    assert await rules(db, at_rest=False) == {inv.WAITING_HAS_OPEN_WAIT}
