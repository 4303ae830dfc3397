"""The SQLite store's operations: SQL and row mapping, run on the writer thread.

Each function runs inside the writer's transaction and records what it changed in the outbox;
the rules of what to write come from ``hearth.store.rules``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from hearth.errors import StoreError
from hearth.records import ConversationCreated, Record
from hearth.store import rules
from hearth.store.events import ABORT, ADMITTED, APPENDED, RELEASED, SETTLED, Event
from hearth.store.rows import (
    DELIVERY_ADMITTED,
    DELIVERY_FAILED,
    JOINED,
    QUEUED,
    RUNNING,
    Admission,
    DeliveryAdmission,
    Fence,
    NewDelivery,
    NewSubmission,
    ScheduleCursor,
    StoredDelivery,
    cursor_from_row,
    delivery_from_row,
    submission_from_row,
)
from hearth.store.rows import SETTLED as SETTLED_STATUS
from hearth.store.sqlite_writer import Outbox

# Only heads are looked at (one per conversation: its oldest queued or running submission), so a
# claim costs the same however many submissions wait behind them.
CLAIM = """
UPDATE submissions SET
    status = 'running',
    attempt = attempt + 1,
    lease_owner = :owner,
    lease_expires_at = :expires,
    started_at = COALESCE(started_at, :now),
    deadline = COALESCE(deadline, :now + timeout)
WHERE seq IN (
    SELECT seq FROM submissions INDEXED BY submissions_heads
    WHERE is_head = 1
      AND (status = 'queued' OR (status = 'running' AND COALESCE(lease_expires_at, 0) <= :now))
      AND conversation_id NOT IN (SELECT value FROM json_each(:excluded))
    ORDER BY seq
    LIMIT :limit)
RETURNING *
"""

# After a head settles, the next queued submission of its conversation is the head.
NEXT_HEAD = """
UPDATE submissions SET is_head = 1 WHERE seq = (
    SELECT MIN(seq) FROM submissions WHERE conversation_id = ? AND status = 'queued')
"""


def check_fence(conn: sqlite3.Connection, fence: Fence) -> sqlite3.Row:
    row = submission_row(conn, fence.submission_id)
    rules.check_fence(
        fence, None if row is None else row["status"], None if row is None else row["attempt"]
    )
    assert row is not None
    return row


def append(
    conn: sqlite3.Connection,
    conversation_id: str,
    records: list[Record],
    outbox: Outbox,
    now: float,
) -> list[int]:
    row = conn.execute(
        "SELECT last_offset FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    if row is not None:
        last = int(row[0])
    elif (
        records
        and isinstance(records[0], ConversationCreated)
        and records[0].conversation_id == conversation_id
    ):
        created = records[0]
        conn.execute(
            "INSERT INTO conversations (conversation_id, agent, parent, last_offset, created_at,"
            " last_activity) VALUES (?, ?, ?, -1, ?, ?)",
            (conversation_id, created.agent, rules.to_json_or_none(created.parent), now, now),
        )
        last = -1
    else:
        raise StoreError(f"conversation {conversation_id} does not exist; admit a submission first")
    start, offsets, new = last, [], []
    for record in records:
        body, digest = record.encode(last + 1)
        inserted = conn.execute(
            'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)'
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (conversation_id, last + 1, record.id, record.type, record.submission_id, body, digest),
        ).rowcount
        if inserted:
            last += 1
            offsets.append(last)
            new.append(record)
            continue
        existing = conn.execute(
            'SELECT "offset", digest FROM records WHERE conversation_id = ? AND id = ?',
            (conversation_id, record.id),
        ).fetchone()
        if existing is None:
            raise StoreError(f"offset {last + 1} of {conversation_id} is taken: corrupt stream")
        offsets.append(
            rules.check_reappend(conversation_id, record, digest, int(existing[0]), existing[1])
        )
    for name, value in rules.state_changes(new).items():
        conn.execute(
            "INSERT INTO state (conversation_id, name, value) VALUES (?, ?, ?)"
            " ON CONFLICT (conversation_id, name) DO UPDATE SET value = excluded.value",
            (conversation_id, name, rules.to_json(value)),
        )
    if last != start:
        conn.execute(
            "UPDATE conversations SET last_offset = ?, last_activity = ? WHERE conversation_id = ?",
            (last, now, conversation_id),
        )
        outbox.append(Event(APPENDED, conversation_id, last))
    return offsets


def admit(conn: sqlite3.Connection, new: NewSubmission, outbox: Outbox, now: float) -> Admission:
    conversation_id = new.conversation_id
    if last_offset(conn, conversation_id) < 0:
        append(conn, conversation_id, [rules.conversation_created(new)], outbox, now)
    if new.idempotency_key is not None:
        row = conn.execute(
            "SELECT * FROM submissions WHERE conversation_id = ? AND idempotency_key = ?",
            (conversation_id, new.idempotency_key),
        ).fetchone()
        if row is not None:
            rules.check_idempotent(new, row["payload_digest"])
            return Admission(submission_from_row(row), row["admitted_offset"], True)
    offset = last_offset(conn, conversation_id)
    busy = conn.execute(
        "SELECT 1 FROM submissions WHERE conversation_id = ? AND status IN (?, ?) LIMIT 1",
        (conversation_id, QUEUED, RUNNING),
    ).fetchone()
    row = conn.execute(
        "INSERT INTO submissions (id, conversation_id, kind, payload, idempotency_key,"
        " payload_digest, admitted_offset, status, attempt, max_attempts, timeout, accepted_at,"
        " is_head, source, traceparent)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?) RETURNING *",
        (
            rules.new_submission_id(),
            conversation_id,
            new.kind,
            rules.to_json(new.payload),
            new.idempotency_key,
            rules.payload_digest(new.kind, new.payload),
            offset,
            QUEUED,
            new.max_attempts,
            new.timeout,
            now,
            0 if busy else 1,
            rules.to_json_or_none(new.source),
            new.traceparent,
        ),
    ).fetchone()
    admitted = submission_from_row(row)
    outbox.append(Event(ADMITTED, conversation_id, offset, admitted.id))
    return Admission(admitted, offset, False)


def settle(
    conn: sqlite3.Connection,
    fence: Fence,
    batch: list[Record],
    result: tuple[str, dict[str, Any] | None, str | None],
    outbox: Outbox,
    now: float,
) -> int:
    outcome, error, reply = result
    host = check_fence(conn, fence)
    conversation_id = host["conversation_id"]
    offset = append(conn, conversation_id, batch, outbox, now)[-1]
    error_json = rules.to_json_or_none(error)
    conn.execute(
        "UPDATE submissions SET status = ?, outcome = ?, error = ?, reply = ?,"
        " settled_at = ?, lease_owner = NULL, lease_expires_at = NULL, is_head = 0 WHERE id = ?",
        (SETTLED_STATUS, outcome, error_json, reply, now, fence.submission_id),
    )
    conn.execute(NEXT_HEAD, (conversation_id,))
    outbox.append(Event(SETTLED, conversation_id, offset, fence.submission_id, fence.attempt))
    joined = conn.execute(
        "SELECT id FROM submissions WHERE joined_to = ? AND status = ?"
        " AND settled_at IS NULL ORDER BY seq",
        (fence.submission_id, JOINED),
    ).fetchall()
    for (sid,) in joined:
        settled = rules.settlement(sid, outcome, error, reply)
        at = append(conn, conversation_id, [settled], outbox, now)[0]
        conn.execute(
            "UPDATE submissions SET outcome = ?, error = ?, reply = ?, settled_at = ? WHERE id = ?",
            (outcome, error_json, reply, now, sid),
        )
        outbox.append(Event(SETTLED, conversation_id, at, sid))
    return offset


def join(
    conn: sqlite3.Connection,
    host: Fence,
    submission_id: str,
    batch: list[Record],
    outbox: Outbox,
    now: float,
) -> bool:
    host_row = check_fence(conn, host)
    row = submission_row(conn, submission_id)
    conversation_id = host_row["conversation_id"]
    if row is None or row["status"] != QUEUED or row["conversation_id"] != conversation_id:
        return False
    conn.execute(
        "UPDATE submissions SET status = ?, joined_to = ?, started_at = ? WHERE id = ?",
        (JOINED, host.submission_id, now, submission_id),
    )
    append(conn, conversation_id, batch, outbox, now)
    return True


def release(conn: sqlite3.Connection, fence: Fence, owner: str, outbox: Outbox) -> bool:
    row = conn.execute(
        "UPDATE submissions SET lease_expires_at = 0, lease_owner = NULL"
        " WHERE id = ? AND status = ? AND attempt = ? AND lease_owner = ?"
        " RETURNING conversation_id",
        (fence.submission_id, RUNNING, fence.attempt, owner),
    ).fetchone()
    if row is None:
        return False
    outbox.append(Event(RELEASED, row[0], submission_id=fence.submission_id))
    return True


def expire_owners(conn: sqlite3.Connection, owners: list[str], outbox: Outbox) -> int:
    rows = conn.execute(
        "UPDATE submissions SET lease_expires_at = 0 WHERE status = ?"
        " AND lease_owner IN (SELECT value FROM json_each(?))"
        " AND (lease_expires_at IS NULL OR lease_expires_at <> 0)"
        " RETURNING id, conversation_id",
        (RUNNING, json.dumps(owners)),
    ).fetchall()
    outbox.extend(Event(RELEASED, conv, submission_id=sid) for sid, conv in rows)
    return len(rows)


def request_abort(
    conn: sqlite3.Connection, conversation_id: str, outbox: Outbox, now: float
) -> list[str]:
    unsettled = (conversation_id, QUEUED, RUNNING)
    conn.execute(
        "UPDATE submissions SET abort_requested_at = COALESCE(abort_requested_at, ?)"
        " WHERE conversation_id = ? AND status IN (?, ?)",
        (now, *unsettled),
    )
    rows = conn.execute(
        "SELECT id FROM submissions WHERE conversation_id = ? AND status IN (?, ?) ORDER BY seq",
        unsettled,
    )
    ids = [row[0] for row in rows]
    if ids:
        outbox.append(Event(ABORT, conversation_id, last_offset(conn, conversation_id)))
    return ids


def last_offset(conn: sqlite3.Connection, conversation_id: str) -> int:
    row = conn.execute(
        "SELECT last_offset FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    return -1 if row is None else int(row[0])


def submission_row(conn: sqlite3.Connection, submission_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM submissions WHERE id = ?", (submission_id,)
    ).fetchone()
    return row


# --- channel deliveries and schedule cursors ---------------------------------------------------
def delivery_row(conn: sqlite3.Connection, channel: str, delivery_id: str) -> StoredDelivery | None:
    row = conn.execute(
        "SELECT * FROM deliveries WHERE channel = ? AND delivery_id = ?", (channel, delivery_id)
    ).fetchone()
    return None if row is None else delivery_from_row(row)


def admit_delivery(
    conn: sqlite3.Connection,
    delivery: NewDelivery,
    submissions: list[NewSubmission],
    outbox: Outbox,
    now: float,
) -> DeliveryAdmission:
    known = delivery_row(conn, delivery.channel, delivery.delivery_id)
    if known is not None and known.status == DELIVERY_ADMITTED:
        return DeliveryAdmission(known, True)
    ids = [admit(conn, new, outbox, now).submission.id for new in submissions]
    values = rules.delivery_values(delivery, DELIVERY_ADMITTED, ids, None, now)
    conn.execute(UPSERT_DELIVERY, values)
    stored = delivery_row(conn, delivery.channel, delivery.delivery_id)
    assert stored is not None
    return DeliveryAdmission(stored, False)


def fail_delivery(
    conn: sqlite3.Connection, delivery: NewDelivery, error: dict[str, Any], now: float
) -> StoredDelivery:
    known = delivery_row(conn, delivery.channel, delivery.delivery_id)
    if known is None or known.status != DELIVERY_ADMITTED:
        conn.execute(
            UPSERT_DELIVERY, rules.delivery_values(delivery, DELIVERY_FAILED, [], error, now)
        )
    stored = delivery_row(conn, delivery.channel, delivery.delivery_id)
    assert stored is not None
    return stored


# A delivery routed again keeps its first body and arrival; each routing counts one attempt.
UPSERT_DELIVERY = """
INSERT INTO deliveries (channel, delivery_id, type, status, data, body, headers, submission_ids,
    error, attempts, received_at, updated_at)
VALUES (:channel, :delivery_id, :type, :status, :data, :body, :headers, :submission_ids,
    :error, 1, :received_at, :now)
ON CONFLICT (channel, delivery_id) DO UPDATE SET
    status = excluded.status, submission_ids = excluded.submission_ids, error = excluded.error,
    attempts = deliveries.attempts + 1, updated_at = excluded.updated_at
"""


def open_schedule(conn: sqlite3.Connection, name: str, spec: str, now: float) -> ScheduleCursor:
    conn.execute(
        "INSERT INTO schedules (name, spec, cursor, last_occurrence, updated_at)"
        " VALUES (?, ?, ?, NULL, ?) ON CONFLICT (name) DO NOTHING",
        (name, spec, now, now),
    )
    conn.execute(
        "UPDATE schedules SET spec = ?, cursor = ?, updated_at = ? WHERE name = ? AND spec <> ?",
        (spec, now, now, name, spec),
    )
    row = conn.execute("SELECT * FROM schedules WHERE name = ?", (name,)).fetchone()
    return cursor_from_row(row)


def admit_occurrence(
    conn: sqlite3.Connection,
    name: str,
    spec: str,
    cursor: float,
    occurrence: float,
    new: NewSubmission,
    outbox: Outbox,
    now: float,
) -> Admission | None:
    moved = conn.execute(
        "UPDATE schedules SET cursor = ?, last_occurrence = ?, updated_at = ?"
        " WHERE name = ? AND spec = ? AND cursor = ?",
        (occurrence, occurrence, now, name, spec, cursor),
    ).rowcount
    if not moved:
        return None
    return admit(conn, new, outbox, now)
