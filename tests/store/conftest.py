"""The store fixtures: every conformance test runs once per store implementation.

A store joins the suite by adding a param here and a branch in ``_make``. ``store_pair`` gives
two handles on one database: two real connections where the store allows several processes, the
same handle twice where one process owns the database (SQLite), so the two-handle tests run as
stale-fence cases there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hearth.store import Store
from hearth.store.sqlite import SQLiteStore
from hearth.testing.clock import ManualClock

STORES = ["sqlite-file", "sqlite-memory"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _make(kind: str, tmp_path: Path, clock: ManualClock) -> Store:
    if kind == "sqlite-file":
        return SQLiteStore(str(tmp_path / "hearth.db"), clock=clock)
    if kind == "sqlite-memory":
        return SQLiteStore(":memory:", clock=clock)
    raise AssertionError(kind)  # pragma: no cover


@pytest.fixture(params=STORES)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[Store]:
    made = _make(request.param, tmp_path, clock)
    await made.open()
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture(params=STORES)
async def store_pair(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[tuple[Store, Store]]:
    first = _make(request.param, tmp_path, clock)
    await first.open()
    try:
        yield first, first  # SQLite: one process owns the file, so both handles are one
    finally:
        await first.close()
