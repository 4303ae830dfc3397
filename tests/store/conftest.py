"""The store fixture: every conformance test runs once per store implementation.

A PostgreSQL store joins the suite by adding a param here and a branch in ``store``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hearth.store import Store
from hearth.store.sqlite import SQLiteStore


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite-file", "sqlite-memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite-file":
        made: Store = SQLiteStore(str(tmp_path / "hearth.db"))
    elif request.param == "sqlite-memory":
        made = SQLiteStore(":memory:")
    else:  # pragma: no cover
        raise AssertionError(request.param)
    await made.open()
    try:
        yield made
    finally:
        await made.close()
