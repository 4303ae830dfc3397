"""The store fixtures: every conformance test runs once per store implementation.

A store joins the suite by adding a param here and a branch in ``_make``. ``store_pair`` gives
two handles on one database: two stores (two pools, two listeners) on PostgreSQL, the same
handle twice where one process owns the database (SQLite), so the two-handle tests run as
stale-fence cases there. The PostgreSQL param uses the session's throwaway cluster and a fresh
schema per test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pgcluster import Cluster, new_schema

from hearth.store import Store
from hearth.store.sqlite import SQLiteStore
from hearth.testing.clock import ManualClock

if TYPE_CHECKING:
    from hearth.store.postgres import PostgresStore

STORES = ["sqlite-file", "sqlite-memory", "postgres"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _make(
    kind: str, tmp_path: Path, clock: ManualClock, request: pytest.FixtureRequest, schema: str
) -> Store:
    if kind == "postgres":
        from hearth.store.postgres import PostgresStore

        cluster: Cluster = request.getfixturevalue("pg_cluster")
        return PostgresStore(cluster.conninfo, schema=schema, clock=clock)
    if kind == "sqlite-file":
        return SQLiteStore(str(tmp_path / "hearth.db"), clock=clock)
    if kind == "sqlite-memory":
        return SQLiteStore(":memory:", clock=clock)
    raise AssertionError(kind)  # pragma: no cover


@pytest.fixture(params=STORES)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[Store]:
    made = _make(request.param, tmp_path, clock, request, new_schema())
    await made.open()
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture(params=STORES)
async def store_pair(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[tuple[Store, Store]]:
    schema = new_schema()
    first = _make(request.param, tmp_path, clock, request, schema)
    await first.open()
    if request.param != "postgres":
        try:
            yield first, first  # SQLite: one process owns the file, so both handles are one
        finally:
            await first.close()
        return
    second = _make(request.param, tmp_path, clock, request, schema)
    await second.open()
    try:
        yield first, second
    finally:
        await second.close()
        await first.close()


@pytest.fixture
async def pg_store(pg_cluster: Cluster) -> AsyncIterator[PostgresStore]:
    """A PostgreSQL store on a fresh schema of the session's cluster, open."""
    from hearth.store.postgres import PostgresStore

    store = PostgresStore(pg_cluster.conninfo, schema=new_schema())
    await store.open()
    try:
        yield store
    finally:
        await store.close()
