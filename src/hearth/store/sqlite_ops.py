"""The SQLite store's operations: SQL and row mapping, run on the writer thread.

Each function runs inside the writer's transaction and records what it changed in the outbox;
the rules of what to write come from ``hearth.store.rules``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hearth.errors import (
    AbortRequested,
    ConversationExists,
    ConversationNotFound,
    StoreError,
    WaitNotFound,
)
from hearth.records import ConversationCreated, Record, WaitStarted
from hearth.store import rules
from hearth.store.events import ABORT, ADMITTED, APPENDED, RELEASED, SETTLED, Event
from hearth.store.rows import (
    DELIVERY_ADMITTED,
    DELIVERY_FAILED,
    JOINED,
    OPEN_SQL,
    QUEUED,
    RUNNING,
    UNSETTLED_SQL,
    WAIT_ABORTED,
    WAIT_PENDING,
    WAIT_RESOLVED,
    WAIT_TIMED_OUT,
    WAITING,
    Admission,
    Blob,
    ConversationInfo,
    DeliveryAdmission,
    Fence,
    NewDelivery,
    NewSubmission,
    ScheduleCursor,
    StoredDelivery,
    Submission,
    Wait,
    blob_from_row,
    cursor_from_row,
    delivery_from_row,
    stored_record,
    submission_from_row,
    wait_from_row,
)
from hearth.store.rows import SETTLED as SETTLED_STATUS
from hearth.store.sqlite_writer import Outbox

# Only heads are looked at (one per conversation: its oldest queued or running submission), so a
# claim costs the same however many submissions wait behind them; and only heads that may run,
# so waiting conversations (a person's answer may take days) cost it nothing either.
CLAIM = """
UPDATE submissions SET
    status = 'running',
    attempt = attempt + 1,
    lease_owner = :owner,
    lease_expires_at = :expires,
    started_at = COALESCE(started_at, :now),
    deadline = COALESCE(deadline, :now + timeout)
WHERE seq IN (
    SELECT seq FROM submissions INDEXED BY submissions_claimable
    WHERE is_head = 1 AND status IN ('queued', 'running')
      AND (status = 'queued' OR (status = 'running' AND COALESCE(lease_expires_at, 0) <= :now))
      AND conversation_id NOT IN (SELECT value FROM json_each(:excluded))
      AND (:aborting_only = 0 OR abort_requested_at IS NOT NULL)
      AND (:agents IS NULL OR accepted_at <= :others_before OR substr(conversation_id, 1,
           instr(conversation_id, '/') - 1) IN (SELECT value FROM json_each(:agents)))
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
    """The fenced submission's row (the columns the fenced writes use), once its claim is
    ``fence``'s; ``FencedOut`` otherwise."""
    row: sqlite3.Row | None = conn.execute(
        "SELECT status, attempt, conversation_id, abort_requested_at FROM submissions WHERE id = ?",
        (fence.submission_id,),
    ).fetchone()
    rules.check_fence(
        fence, None if row is None else row["status"], None if row is None else row["attempt"]
    )
    assert row is not None
    return row


# A fenced append's fence and the stream's end in one statement.
_FENCE_AND_END = (
    "SELECT s.status, s.attempt, c.last_offset FROM submissions s"
    " LEFT JOIN conversations c ON c.conversation_id = ? WHERE s.id = ?"
)


def append(
    conn: sqlite3.Connection,
    conversation_id: str,
    records: list[Record],
    outbox: Outbox,
    now: float,
    fence: Fence | None = None,
) -> list[int]:
    """Append ``records`` (``FencedOut`` first, when ``fence`` is given and not current)."""
    if fence is None:
        row = conn.execute(
            "SELECT last_offset FROM conversations WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
        end = None if row is None else row[0]
    else:
        row = conn.execute(_FENCE_AND_END, (conversation_id, fence.submission_id)).fetchone()
        rules.check_fence(fence, None if row is None else row[0], None if row is None else row[1])
        end = row[2]
    if end is not None:
        last = int(end)
    elif (
        records
        and isinstance(records[0], ConversationCreated)
        and records[0].conversation_id == conversation_id
    ):
        created = records[0]
        # Records under an id with no conversation are what a fork to it was copying: it stops
        # at its next chunk (the conversation exists), and its copies go.
        conn.execute("DELETE FROM records WHERE conversation_id = ?", (conversation_id,))
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
    add_refs(conn, rules.record_refs(conversation_id, new))
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


_SETTLEMENTS, _SUBMISSION_SPANS = rules.fork_evidence_sql(lambda name: f":{name}")


# How many records one job of a fork copies: the writer runs other work between two of them (a
# fork of 100,000 records in one job held every other write for 2.5 s).
FORK_CHUNK = 1000


@dataclass
class ForkCopy:
    """What a fork's chunks gathered for its last job: the state the copies write (later ones
    winning) and the attachments they reference."""

    state: dict[str, Any] = field(default_factory=dict)
    refs: set[tuple[str, str]] = field(default_factory=set)


def fork_begin(conn: sqlite3.Connection, source: str, offset: int, target: str) -> str:
    """Check a fork of ``source`` at ``offset`` into ``target`` and clear what an unfinished fork
    to ``target`` left; return the source's agent. The copy follows in chunks (``fork_copy``)
    under ``target``, which has no ``conversations`` row (and so does not exist) until
    ``fork_finish``."""
    row = conn.execute(
        "SELECT agent, last_offset FROM conversations WHERE conversation_id = ?", (source,)
    ).fetchone()
    if row is None:
        raise ConversationNotFound(f"no conversation {source!r}")
    _check_absent(conn, target)
    rules.check_fork(source, offset, int(row[1]), _rest_points(conn, source))
    conn.execute("DELETE FROM records WHERE conversation_id = ?", (target,))
    return str(row[0])


def fork_copy(
    conn: sqlite3.Connection,
    _: Outbox,
    *,
    source: str,
    target: str,
    after: int,
    upto: int,
    copy: ForkCopy,
) -> None:
    """Copy the records of ``source`` at offsets ``after`` < o <= ``upto`` into ``target``."""
    _check_absent(conn, target)  # (created meanwhile: the copy stops)
    rows = conn.execute(
        'SELECT body FROM records WHERE conversation_id = ? AND "offset" > ? AND "offset" <= ?'
        ' ORDER BY "offset"',
        (source, after, upto),
    ).fetchall()
    copies = [rules.fork_copy(stored_record(body, source), target) for (body,) in rows]
    for record in copies:
        body, digest = record.encode(record.offset)
        conn.execute(
            'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)'
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (target, record.offset, record.id, record.type, record.submission_id, body, digest),
        )
    copy.state.update(rules.state_changes(copies))
    copy.refs.update(rules.record_refs(target, copies))


def fork_finish(
    conn: sqlite3.Connection,
    source: str,
    offset: int,
    target: str,
    agent: str,
    copy: ForkCopy,
    outbox: Outbox,
    now: float,
) -> ConversationInfo:
    """Make the copied fork a conversation: its ``conversation_created``, its row, its state."""
    _check_absent(conn, target)
    (copied,) = conn.execute(
        "SELECT COUNT(*) FROM records WHERE conversation_id = ?", (target,)
    ).fetchone()
    if copied != offset:  # (records 1..offset; what else would have changed them is a bug)
        raise StoreError(f"the fork {target!r} has {copied} of its {offset} records; fork again")
    created = rules.fork_created(source, offset, target, agent)
    body, digest = created.encode(0)
    conn.execute(
        "INSERT INTO conversations (conversation_id, agent, parent, last_offset, created_at,"
        " last_activity) VALUES (?, ?, NULL, ?, ?, ?)",
        (target, agent, offset, now, now),
    )
    conn.execute(
        'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)'
        " VALUES (?, 0, ?, ?, NULL, ?, ?)",
        (target, created.id, created.type, body, digest),
    )
    for name, value in copy.state.items():
        conn.execute(
            "INSERT INTO state (conversation_id, name, value) VALUES (?, ?, ?)",
            (target, name, rules.to_json(value)),
        )
    add_refs(conn, sorted(copy.refs))
    outbox.append(Event(APPENDED, target, offset))
    return ConversationInfo(target, agent, offset)


def _check_absent(conn: sqlite3.Connection, target: str) -> None:
    if last_offset(conn, target) >= 0:
        raise ConversationExists(f"conversation {target!r} already exists; fork to a new id")


def _rest_points(conn: sqlite3.Connection, conversation_id: str, depth: int = 0) -> list[int]:
    settlements = [r[0] for r in conn.execute(_SETTLEMENTS, {"c": conversation_id})]
    spans = [(r[0], r[1]) for r in conn.execute(_SUBMISSION_SPANS, {"c": conversation_id})]
    points = rules.rest_points(settlements, spans)
    first = conn.execute(
        'SELECT body FROM records WHERE conversation_id = ? AND "offset" = 0', (conversation_id,)
    ).fetchone()
    origin = rules.forked_from(None if first is None else stored_record(first[0], conversation_id))
    if origin is None or depth >= rules.MAX_FORK_DEPTH:
        return points
    inherited = _rest_points(conn, origin[0], depth + 1)
    return rules.inherited_rest_points(points, origin[1], inherited)


def admit(conn: sqlite3.Connection, new: NewSubmission, outbox: Outbox, now: float) -> Admission:
    conversation_id = new.conversation_id
    offset = last_offset(conn, conversation_id)
    if offset < 0:
        append(conn, conversation_id, [rules.conversation_created(new)], outbox, now)
        offset = last_offset(conn, conversation_id)
    if new.idempotency_key is not None:
        row = conn.execute(
            "SELECT * FROM submissions WHERE conversation_id = ? AND idempotency_key = ?",
            (conversation_id, new.idempotency_key),
        ).fetchone()
        if row is not None:
            rules.check_idempotent(new, row["payload_digest"])
            return Admission(submission_from_row(row), row["admitted_offset"], True)
    submission_id = rules.new_submission_id()
    payload, source = rules.to_json(new.payload), rules.to_json_or_none(new.source)
    values = (
        submission_id,
        conversation_id,
        new.kind,
        payload,
        new.idempotency_key,
        rules.payload_digest(new.kind, new.payload),
        offset,
        new.max_attempts,
        new.timeout,
        now,
        conversation_id,
        source,
        new.traceparent,
    )
    (seq,) = conn.execute(_ADMIT, values).fetchone()
    # The row as a read of it would give (its JSON decoded again): the statement returns only
    # what the database chose, which saves a fifth of an admission's work here.
    admitted = Submission(
        id=submission_id,
        conversation_id=conversation_id,
        kind=new.kind,
        payload=json.loads(payload),
        idempotency_key=new.idempotency_key,
        status=QUEUED,
        outcome=None,
        error=None,
        reply=None,
        attempt=0,
        max_attempts=new.max_attempts,
        timeout=float(new.timeout),
        deadline=None,
        lease_owner=None,
        lease_expires_at=None,
        abort_requested_at=None,
        accepted_at=float(now),
        started_at=None,
        settled_at=None,
        seq=seq,
        source=None if source is None else json.loads(source),
        traceparent=new.traceparent,
    )
    store_blobs(conn, new.blobs, now)
    add_refs(conn, rules.payload_refs(submission_id, new.payload))
    outbox.append(Event(ADMITTED, conversation_id, offset, submission_id))
    return Admission(admitted, offset, False)


# One statement: the new submission heads its conversation when none of the conversation's is
# open (queued, running or waiting) as it is admitted.
_ADMIT = (
    "INSERT INTO submissions (id, conversation_id, kind, payload, idempotency_key,"
    " payload_digest, admitted_offset, status, attempt, max_attempts, timeout, accepted_at,"
    f" is_head, source, traceparent) VALUES (?, ?, ?, ?, ?, ?, ?, '{QUEUED}', 0, ?, ?, ?,"
    f" NOT EXISTS (SELECT 1 FROM submissions WHERE conversation_id = ? AND status IN {OPEN_SQL}),"
    " ?, ?) RETURNING seq"
)


def store_blobs(conn: sqlite3.Connection, blobs: tuple[Blob, ...], now: float) -> None:
    """Keep each attachment's bytes once: a copy already stored is never rewritten."""
    for blob in blobs:
        conn.execute(
            "INSERT INTO attachments (sha256, media_type, size, data, created_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (sha256) DO NOTHING",
            (blob.sha256, blob.media_type, blob.size, blob.data, now),
        )


def add_refs(conn: sqlite3.Connection, refs: list[tuple[str, str]]) -> None:
    if refs:
        conn.executemany(
            "INSERT INTO attachment_refs (sha256, holder) VALUES (?, ?) ON CONFLICT DO NOTHING",
            refs,
        )


def get_attachment(conn: sqlite3.Connection, sha256: str, with_data: bool) -> Blob | None:
    columns = "sha256, media_type, size, created_at" + (", data" if with_data else "")
    row = conn.execute(f"SELECT {columns} FROM attachments WHERE sha256 = ?", (sha256,)).fetchone()
    return None if row is None else blob_from_row(row)


UNREFERENCED = (
    "SELECT sha256, media_type, size, created_at FROM attachments a WHERE NOT EXISTS"
    " (SELECT 1 FROM attachment_refs r WHERE r.sha256 = a.sha256) ORDER BY sha256"
)


def collect_attachments(conn: sqlite3.Connection, dry_run: bool) -> list[Blob]:
    """Delete (unless ``dry_run``) every attachment that nothing references, in this one
    transaction; return what was (or would be) freed."""
    found = [blob_from_row(row) for row in conn.execute(UNREFERENCED)]
    if not dry_run and found:
        conn.execute(
            "DELETE FROM attachments WHERE sha256 IN (SELECT value FROM json_each(?))"
            " AND NOT EXISTS (SELECT 1 FROM attachment_refs r"
            " WHERE r.sha256 = attachments.sha256)",
            (json.dumps([b.sha256 for b in found]),),
        )
    return found


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
    row = _settled_row(conn, fence.submission_id)
    outbox.append(Event(SETTLED, conversation_id, offset, fence.submission_id, fence.attempt, row))
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
        outbox.append(Event(SETTLED, conversation_id, at, sid, row=_settled_row(conn, sid)))
    return offset


def _settled_row(conn: sqlite3.Connection, submission_id: str) -> Submission | None:
    """The row a settlement left, for the waiters its event wakes in this process."""
    row = submission_row(conn, submission_id)
    return None if row is None else submission_from_row(row)


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


def release(
    conn: sqlite3.Connection, fence: Fence, owner: str, outbox: Outbox, graceful: bool = False
) -> bool:
    row = conn.execute(
        "UPDATE submissions SET lease_expires_at = 0, lease_owner = NULL,"
        " releases = releases + ? WHERE id = ? AND status = ? AND attempt = ? AND lease_owner = ?"
        " RETURNING conversation_id",
        (int(graceful), fence.submission_id, RUNNING, fence.attempt, owner),
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
    conn.execute(
        "UPDATE submissions SET abort_requested_at = COALESCE(abort_requested_at, ?)"
        f" WHERE conversation_id = ? AND {UNSETTLED_SQL}",
        (now, conversation_id),
    )
    rows = conn.execute(
        f"SELECT id, status FROM submissions WHERE conversation_id = ? AND {UNSETTLED_SQL}"
        " ORDER BY seq",
        (conversation_id,),
    ).fetchall()
    for sid, status in rows:
        if status == WAITING:
            for wait in pending_waits(conn, sid):
                end_wait(conn, wait, WAIT_ABORTED, None, outbox, now)
            resume(conn, sid, outbox, now)
    ids = [row[0] for row in rows]
    if ids:
        outbox.append(Event(ABORT, conversation_id, last_offset(conn, conversation_id)))
    return ids


# --- durable waits --------------------------------------------------------------------------------
def begin_wait(
    conn: sqlite3.Connection,
    fence: Fence,
    started: list[tuple[str, WaitStarted]],
    carried: Mapping[str, Any] | None,
    outbox: Outbox,
    now: float,
) -> None:
    host = check_fence(conn, fence)
    if host["abort_requested_at"] is not None:
        raise AbortRequested(f"submission {fence.submission_id} is being aborted; it cannot wait")
    for conversation_id, record in started:
        append(conn, conversation_id, [record], outbox, now)
        row = rules.wait_row(record)
        conn.execute(
            "INSERT INTO waits (conversation_id, wait_id, submission_id, tool_call_id, name,"
            " prompt, expires_at, created_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (conversation_id, wait_id) DO NOTHING",
            (
                conversation_id,
                row["wait_id"],
                row["submission_id"],
                row["tool_call_id"],
                row["name"],
                row["prompt"],
                row["expires_at"],
                now,
                WAIT_PENDING,
            ),
        )
    if not pending_waits(conn, fence.submission_id):
        raise StoreError(f"submission {fence.submission_id} has no pending wait to wait for")
    conn.execute(
        "UPDATE submissions SET status = ?, lease_owner = NULL, lease_expires_at = NULL,"
        " waits = waits + 1, waiting_since = ?, carried = ? WHERE id = ?",
        (WAITING, now, rules.carried_column(carried), fence.submission_id),
    )


def resolve_wait(
    conn: sqlite3.Connection,
    conversation_id: str,
    wait_id: str,
    value: Any,
    outbox: Outbox,
    now: float,
) -> Wait:
    row = conn.execute(
        "SELECT * FROM waits WHERE conversation_id = ? AND wait_id = ?",
        (conversation_id, wait_id),
    ).fetchone()
    if row is None:
        raise WaitNotFound(f"no wait {wait_id!r} in conversation {conversation_id}")
    wait = wait_from_row(row)
    sub = submission_row(conn, wait.submission_id)
    status = None if sub is None else sub["status"]
    expired = wait.expires_at is not None and wait.expires_at <= now
    if rules.judge_resolve(wait_id, wait.state, row["value"], status, value, expired):
        end_wait(conn, wait, WAIT_RESOLVED, value, outbox, now)
        resume(conn, wait.submission_id, outbox, now)
        row = conn.execute("SELECT * FROM waits WHERE seq = ?", (wait.seq,)).fetchone()
    return wait_from_row(row)


def expire_waits(conn: sqlite3.Connection, limit: int, outbox: Outbox, now: float) -> list[Wait]:
    rows = conn.execute(
        f"SELECT * FROM waits WHERE state = '{WAIT_PENDING}' AND expires_at IS NOT NULL"
        " AND expires_at <= ? ORDER BY expires_at LIMIT ?",
        (now, limit),
    ).fetchall()
    ended = []
    for row in rows:
        wait = wait_from_row(row)
        end_wait(conn, wait, WAIT_TIMED_OUT, None, outbox, now)
        resume(conn, wait.submission_id, outbox, now)
        ended.append(wait)
    return ended


def end_wait(
    conn: sqlite3.Connection, wait: Wait, state: str, value: Any, outbox: Outbox, now: float
) -> None:
    """Close a pending wait: its ``wait_resolved`` record and its row, together."""
    sub = submission_row(conn, wait.submission_id)
    attempt = 0 if sub is None else int(sub["attempt"])
    record = rules.wait_resolved(
        wait.wait_id,
        wait.submission_id,
        attempt,
        value=value,
        timed_out=state == WAIT_TIMED_OUT,
        aborted=state == WAIT_ABORTED,
    )
    append(conn, wait.conversation_id, [record], outbox, now)
    conn.execute(
        "UPDATE waits SET state = ?, value = ?, resolved_at = ? WHERE seq = ?",
        (state, None if state != WAIT_RESOLVED else rules.to_json(value), now, wait.seq),
    )


def resume(conn: sqlite3.Connection, submission_id: str, outbox: Outbox, now: float) -> None:
    """A waiting submission with no pending wait left is queued again; its deadline moves on
    by the time it waited (waiting does not count toward ``Durability.timeout``)."""
    if pending_waits(conn, submission_id):
        return
    row = conn.execute(
        "UPDATE submissions SET status = ?,"
        " deadline = deadline + MAX(0, ? - COALESCE(waiting_since, ?)), waiting_since = NULL"
        " WHERE id = ? AND status = ? RETURNING conversation_id",
        (QUEUED, now, now, submission_id, WAITING),
    ).fetchone()
    if row is not None:
        conversation_id = row[0]
        offset = last_offset(conn, conversation_id)
        outbox.append(Event(ADMITTED, conversation_id, offset, submission_id))


def pending_waits(conn: sqlite3.Connection, submission_id: str) -> list[Wait]:
    rows = conn.execute(
        "SELECT * FROM waits WHERE submission_id = ? AND state = ? ORDER BY seq",
        (submission_id, WAIT_PENDING),
    )
    return [wait_from_row(row) for row in rows]


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


# A delivery routed again keeps its first arrival, and shows what its latest routing was given
# (the body a failure failed on, or the one admitted); each routing counts one attempt.
UPSERT_DELIVERY = """
INSERT INTO deliveries (channel, delivery_id, type, status, data, body, headers, submission_ids,
    error, attempts, received_at, updated_at)
VALUES (:channel, :delivery_id, :type, :status, :data, :body, :headers, :submission_ids,
    :error, 1, :received_at, :now)
ON CONFLICT (channel, delivery_id) DO UPDATE SET
    type = excluded.type, data = excluded.data, body = excluded.body, headers = excluded.headers,
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
