"""Running the PostgreSQL store's work: one transaction per call, retried across lost connections.

A lost connection (server restart, ``pg_terminate_backend``, failover) is retried with backoff
within a time budget. When it was lost while a write may have committed, the next try first runs
the write's ``resolve``: a read of what that write would have left (its deterministic record
ids, its submission id, its claim token). What it finds is the answer; nothing is written twice.
Events are published in this process after the commit; peers hear of them by ``NOTIFY``, sent
right after the commit by ``Notes`` (an abort intent: inside its transaction).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from hearth import _faults
from hearth.errors import HearthError, StoreError, StoreUnavailable
from hearth.store import postgres_ops as ops
from hearth.store.events import ABORT, StoreEvents
from hearth.store.postgres_listen import Notes, encode

T = TypeVar("T")
Work = Callable[[ops.Conn, ops.Outbox], Awaitable[T]]
Resolve = Callable[[ops.Conn], Awaitable[T | None]]

ADMIT_WAIT_S = 1.5  # admission gives up within two seconds, so HTTP answers 503 quickly
READ_RETRY_S = 10.0
RECONNECT_S = 3.0


async def open_pool(
    conninfo: str, connect_kwargs: dict[str, Any], size: int
) -> AsyncConnectionPool[ops.Conn]:
    pool: AsyncConnectionPool[ops.Conn] = AsyncConnectionPool(
        conninfo,
        min_size=1,
        max_size=size,
        kwargs={**connect_kwargs, "autocommit": True, "row_factory": dict_row},
        open=False,
        timeout=ADMIT_WAIT_S,
        # Give up a background reconnection soon: the pool then regrows when a caller waits,
        # instead of after an exponential backoff as long as the outage was.
        reconnect_timeout=RECONNECT_S,
        name="hearth",
    )
    await pool.open()
    return pool


def describe(conninfo: str) -> str:
    """The server and database of ``conninfo``, without credentials, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "PostgreSQL"
    host = info.get("host") or "localhost"
    return f"PostgreSQL at {host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


class Transactions:
    """Runs work on connections of ``pool``; ``where`` names the server in messages."""

    def __init__(
        self,
        pool: AsyncConnectionPool[ops.Conn],
        *,
        where: str,
        channel: str,
        sender: str,
        events: StoreEvents,
        notes: Notes,
    ) -> None:
        self.pool = pool
        self.where = where
        self.channel = channel
        self.sender = sender
        self.events = events
        self.notes = notes

    async def read(self, work: Callable[[ops.Conn], Awaitable[T]]) -> T:
        async def run(conn: ops.Conn, _: ops.Outbox) -> T:
            return await work(conn)

        return await self._run(run, budget_s=READ_RETRY_S, transaction=False)

    async def write(
        self, work: Work[T], *, budget_s: float, resolve: Resolve[T] | None = None
    ) -> T:
        return await self._run(work, budget_s=budget_s, resolve=resolve)

    async def _run(
        self,
        work: Work[T],
        *,
        budget_s: float,
        transaction: bool = True,
        resolve: Resolve[T] | None = None,
    ) -> T:
        end = time.monotonic() + budget_s
        delay, uncertain = 0.05, False
        while True:
            outbox: ops.Outbox = []
            try:
                wait = max(0.05, min(ADMIT_WAIT_S, end - time.monotonic()))
                async with self.pool.connection(timeout=wait) as conn:
                    if uncertain and resolve is not None:
                        found = await resolve(conn)
                        if found is not None:
                            return found
                    if not transaction:
                        return await work(conn, outbox)
                    async with conn.transaction():
                        result = await work(conn, outbox)
                        urgent = [e for e in outbox if e.kind == ABORT]
                        if urgent:
                            await self._notify(conn, urgent)
                        _faults.reached("store:commit-begin")  # the work ran; not committed yet
                    _faults.reached("store:commit-done")  # committed; no caller has heard of it
                self.events.publish_all(outbox)
                self.notes.add([e for e in outbox if e.kind != ABORT])
                return result
            except (HearthError, psycopg.IntegrityError):
                # After a lost COMMIT whose transaction finished late, the retry is refused (the
                # fence moved on, the id exists): what was written is the answer.
                found = await self._resolve_late(resolve) if uncertain else None
                if found is None:
                    raise
                return found
            except (psycopg.OperationalError, PoolTimeout) as exc:
                uncertain = uncertain or transaction  # its COMMIT may have gone through
                if time.monotonic() + delay >= end or self.pool.closed:
                    raise StoreUnavailable(
                        f"{self.where} is unreachable: {first_line(exc)}"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except psycopg.Error as exc:
                raise StoreError(f"{self.where} refused the operation: {first_line(exc)}") from exc

    async def _resolve_late(self, resolve: Resolve[T] | None) -> T | None:
        if resolve is None or self.pool.closed:
            return None
        try:
            async with self.pool.connection(timeout=ADMIT_WAIT_S) as conn:
                return await resolve(conn)
        except (psycopg.Error, PoolTimeout):
            return None

    async def _notify(self, conn: ops.Conn, outbox: ops.Outbox) -> None:
        await conn.execute(
            "SELECT pg_notify(%(ch)s, p) FROM unnest(%(ps)s::text[]) AS p",
            {"ch": self.channel, "ps": [encode(e, self.sender) for e in outbox]},
        )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
