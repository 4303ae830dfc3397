"""A heartbeat renews every lease of its process in one statement, on every store: counted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from hearth.store import NewSubmission, Store
from hearth.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio

_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


@contextmanager
def _postgres_statements(seen: list[str]) -> Iterator[None]:
    import psycopg

    execute = psycopg.AsyncCursor.execute

    async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(query))
        return await execute(self, query, *args, **kwargs)

    psycopg.AsyncCursor.execute = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]


async def statements(store: Store, action: Callable[[], Awaitable[Any]]) -> list[str]:
    """The statements (transaction control aside) the store sends while ``action`` runs."""
    seen: list[str] = []
    if isinstance(store, SQLiteStore):
        await store._write(lambda conn, _: conn.set_trace_callback(seen.append))
        try:
            await action()
        finally:
            await store._write(lambda conn, _: conn.set_trace_callback(None))
    else:
        with _postgres_statements(seen):
            await action()
    return [s for s in seen if not s.lstrip().upper().startswith(_CONTROL)]


@pytest.mark.parametrize("leases", [1, 50])
async def test_a_heartbeat_renews_every_lease_in_one_statement(store: Store, leases: int) -> None:
    for i in range(leases):
        await store.admit(NewSubmission(f"support/c{i}", "support", "message", {"message": "hi"}))
    assert len(await store.claim("owner-1", 30.0, leases)) == leases
    renewed: list[Any] = []

    async def beat() -> None:
        renewed.extend(await store.renew_all("owner-1", 30.0))

    sent = await statements(store, beat)
    assert len(renewed) == leases
    assert len(sent) == 1, sent
