"""``Store.transact`` on PostgreSQL: the application's work and hearth's records in one
transaction of one database.

The transaction first locks the submission's row and checks the fence, so a stale attempt (a
zombie) never runs its work far enough to commit; then the application's function runs on the
connection with the application's ``search_path`` and psycopg's default (tuple) rows; then the
records are inserted without ``ON CONFLICT``: a record that exists fails the transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from hearth.errors import StepError, StoreError
from hearth.records import ConversationCreated, Record
from hearth.store import postgres_session as session
from hearth.store import rules
from hearth.store.events import APPENDED, Event
from hearth.store.postgres_ops import NOW, Conn, Outbox, check_fence, fetchall, fetchone
from hearth.store.postgres_readback import same_attempt
from hearth.store.rows import Fence, stored_record


class AppFailure(Exception):
    """What the application's work (or building the records) raised: rolled back, then raised
    to the caller as it is (``.error``), never mistaken for a fault of the store."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


async def run(
    conn: Conn,
    *,
    conversation_id: str,
    fence: Fence,
    work: Callable[[Any], Awaitable[Any]],
    records: Callable[[Any], Sequence[Record]],
    app_search_path: str,
    schema: str,
    outbox: Outbox,
    now: float | None,
    locked: Callable[[], None] = lambda: None,
    lease_s: float | None = None,
) -> list[Record]:
    """The body of the transaction (the caller opens and commits it). ``locked`` is called
    once the fence is checked: the submission's row is locked from then on. ``lease_s``: the
    claim's lease, renewed from the commit on (renewals leave a locked row alone; without
    this, a transaction longer than the lease committed a row whose lease had run out, and a
    peer could claim healthy work before the next heartbeat)."""
    await check_fence(conn, fence, lock="UPDATE")
    locked()
    row = await fetchone(
        conn,
        "SELECT set_config('search_path', %(p)s, true), txid_current()::text AS xid",
        {"p": app_search_path},
    )
    xid = None if row is None else row["xid"]
    conn.row_factory = tuple_row  # type: ignore[assignment]
    try:
        value = await work(conn)
    except Exception as exc:
        if isinstance(exc, psycopg.OperationalError) and conn.broken:
            raise  # the connection was lost: the store retries (or reads back) as for any write
        raise AppFailure(exc) from exc
    finally:
        conn.row_factory = dict_row
    try:
        batch = list(records(value))
    except Exception as exc:
        raise AppFailure(exc) from exc
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise AppFailure(
            StepError(
                "a statement of the step's function failed and the error was caught, which leaves"
                " the transaction aborted: nothing was committed (to go on after a statement"
                " that may fail, run it in a savepoint: async with conn.transaction(): ...)"
            )
        )
    if status != TransactionStatus.INTRANS:
        raise AppFailure(StepError(_ENDED))
    # What the work set for the session (a plain SET search_path, SET ROLE) would outlive the
    # commit on this pooled connection, and every later use of it would fail: back to the
    # connection's own settings, then hearth's (its records are written as hearth's role, too).
    # First, in the same round trip: is this still the transaction that checked the fence?
    cursor = await conn.execute(
        "SELECT txid_current()::text AS xid; RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL; "
        + session.settings(schema, conn.info.server_version)
    )
    now_in = await cursor.fetchone()
    if now_in is None or now_in["xid"] != xid:
        raise AppFailure(StepError(_ENDED))
    if lease_s is not None:
        await conn.execute(
            "UPDATE submissions SET lease_expires_at ="
            f" GREATEST(lease_expires_at, {NOW} + %(lease_s)s) WHERE id = %(id)s",
            {"now": now, "lease_s": lease_s, "id": fence.submission_id},
        )
    return await insert_new(conn, conversation_id, batch, outbox, now)


# (SQL text sent on ``conn``: psycopg refuses its own ``commit()`` and ``rollback()`` there.)
_ENDED = (
    "the step's function ended its transaction (COMMIT or ROLLBACK sent as SQL on conn): the step"
    " is not recorded, and what the function wrote before that may have committed without it;"
    " never end the transaction of step.transaction (use a savepoint to undo part of it)"
)


async def insert_new(
    conn: Conn, conversation_id: str, batch: list[Record], outbox: Outbox, now: float | None
) -> list[Record]:
    """Append ``batch`` at the end of the stream; an existing id raises ``IntegrityError``."""
    row = await fetchone(
        conn,
        "SELECT last_offset FROM conversations WHERE conversation_id = %(c)s FOR UPDATE",
        {"c": conversation_id},
    )
    if row is None:
        raise StoreError(f"conversation {conversation_id} does not exist")
    last = int(row["last_offset"])
    stored = []
    for record in batch:
        if isinstance(record, ConversationCreated):
            raise ValueError("transact does not create conversations")
        last += 1
        body, digest = record.encode(last)
        await conn.execute(
            'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)'
            " VALUES (%(c)s, %(o)s, %(id)s, %(t)s, %(s)s, %(b)s, %(d)s)",
            {
                "c": conversation_id,
                "o": last,
                "id": record.id,
                "t": record.type,
                "s": record.submission_id,
                "b": body,
                "d": digest,
            },
        )
        stored.append(record.with_offset(last))
    for name, value in rules.state_changes(stored).items():
        await conn.execute(
            "INSERT INTO state (conversation_id, name, value) VALUES (%(c)s, %(n)s, %(v)s)"
            " ON CONFLICT (conversation_id, name) DO UPDATE SET value = excluded.value",
            {"c": conversation_id, "n": name, "v": rules.to_json(value)},
        )
    if stored:
        await conn.execute(
            f"UPDATE conversations SET last_offset = %(o)s, last_activity = {NOW}"
            " WHERE conversation_id = %(c)s",
            {"o": last, "c": conversation_id, "now": now},
        )
        outbox.append(Event(APPENDED, conversation_id, last))
    return stored


async def read_back(
    conn: Conn, conversation_id: str, ids: Sequence[str], fence: Fence
) -> list[Record] | None:
    """The records with ``ids`` when every one is stored by ``fence``'s attempt (an earlier try
    committed; ``readback.same_attempt``), else None: then the retry meets the fence."""
    rows = await fetchall(
        conn,
        "SELECT id, body FROM records WHERE conversation_id = %(c)s AND id = ANY(%(ids)b::text[])",
        {"c": conversation_id, "ids": list(ids)},
    )
    found = {row["id"]: stored_record(row["body"], conversation_id) for row in rows}
    if not ids or any(i not in found for i in ids):
        return None
    if not all(same_attempt(found[i], fence.submission_id, fence.attempt) for i in ids):
        return None
    return [found[i] for i in ids]
