"""The embedded store: one SQLite file, owned by one process, written by one thread.

``SQLiteStore`` turns each ``Store`` method into a closure over SQL and hands it to the
``GroupCommitWriter`` (``sqlite_writer``), which runs it on the only connection and commits
concurrent operations together; ``sqlite_schema`` opens the file and keeps its schema.

Example::

    store = SQLiteStore("hearth.db")
    await store.open()
    new = NewSubmission("support/c-1", "support", "message", {"text": "hi"})
    admission = await store.admit(new)
    await store.close()
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

from hearth.errors import (
    ConfigurationError,
    FencedOut,
    IdempotencyConflict,
    IntegrityError,
    StoreError,
)
from hearth.records import ConversationCreated, Record, StateWrite, SubmissionSettled, loads
from hearth.store.base import (
    JOINED,
    QUEUED,
    RUNNING,
    SETTLED,
    Admission,
    ConversationInfo,
    Fence,
    NewSubmission,
    StreamNotifier,
    Submission,
)
from hearth.store.sqlite_schema import connect
from hearth.store.sqlite_writer import GroupCommitWriter, Touched, Work

T = TypeVar("T")

_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


class SQLiteStore:
    """The ``Store`` on one SQLite file (``":memory:"`` for a private in-memory database).

    ``commits`` and ``ops`` count committed transactions and executed operations, so the effect of
    group commit can be observed.
    """

    def __init__(self, path: str, *, synchronous: str = "FULL") -> None:
        mode = synchronous.upper()
        if mode not in _SYNC_MODES:
            raise ConfigurationError(
                f"synchronous must be one of {', '.join(_SYNC_MODES)}, not {synchronous!r}"
            )
        self.path = path
        self.synchronous = mode
        self.notifier = StreamNotifier()
        self._writer = GroupCommitWriter(lambda: connect(path, mode), self.notifier)

    @property
    def commits(self) -> int:
        return self._writer.commits

    @property
    def ops(self) -> int:
        return self._writer.ops

    @property
    def submitted(self) -> int:
        return self._writer.submitted

    # --- lifecycle ------------------------------------------------------------------------------
    async def open(self) -> None:
        """Open the file, take ownership of it and create or check the schema (the migration)."""
        await self._writer.start()

    async def close(self) -> None:
        """Finish the queued work, stop the writer thread and close the file. Idempotent."""
        await self._writer.stop()

    def pause_writer(self) -> None:
        """Test hook: the writer thread takes no new group until ``resume_writer``."""
        self._writer.pause()

    def resume_writer(self) -> None:
        self._writer.resume()

    async def _call(self, work: Work[T], *, write: bool) -> T:
        return await self._writer.call(work, write=write)

    # --- the stream -----------------------------------------------------------------------------
    async def append(
        self, conversation_id: str, records: Sequence[Record], *, fence: Fence | None = None
    ) -> list[int]:
        batch = list(records)

        def work(conn: sqlite3.Connection, touched: Touched) -> list[int]:
            if fence is not None:
                _check_fence(conn, fence)
            return _append(conn, conversation_id, batch, touched)

        return await self._call(work, write=True)

    async def read(
        self, conversation_id: str, after: int = -1, limit: int | None = None
    ) -> list[Record]:
        def work(conn: sqlite3.Connection, _: Touched) -> list[Record]:
            rows = conn.execute(
                'SELECT body FROM records WHERE conversation_id = ? AND "offset" > ?'
                ' ORDER BY "offset" LIMIT ?',
                (conversation_id, after, -1 if limit is None else limit),
            )
            return [loads(row[0]) for row in rows]

        return await self._call(work, write=False)

    async def last_offset(self, conversation_id: str) -> int:
        def work(conn: sqlite3.Connection, _: Touched) -> int:
            return _last_offset(conn, conversation_id)

        return await self._call(work, write=False)

    async def last_of_type(self, conversation_id: str, record_type: str) -> Record | None:
        def work(conn: sqlite3.Connection, _: Touched) -> Record | None:
            row = conn.execute(
                "SELECT body FROM records WHERE conversation_id = ? AND type = ?"
                ' ORDER BY "offset" DESC LIMIT 1',
                (conversation_id, record_type),
            ).fetchone()
            return None if row is None else loads(row[0])

        return await self._call(work, write=False)

    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None:
        def work(conn: sqlite3.Connection, _: Touched) -> ConversationInfo | None:
            row = conn.execute(
                "SELECT * FROM conversations WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
            return None if row is None else _conversation(row)

        return await self._call(work, write=False)

    async def list_conversations(self, limit: int = 100) -> list[ConversationInfo]:
        """The most recently created conversations first."""

        def work(conn: sqlite3.Connection, _: Touched) -> list[ConversationInfo]:
            rows = conn.execute("SELECT * FROM conversations ORDER BY rowid DESC LIMIT ?", (limit,))
            return [_conversation(row) for row in rows]

        return await self._call(work, write=False)

    async def get_state(self, conversation_id: str) -> dict[str, Any]:
        def work(conn: sqlite3.Connection, _: Touched) -> dict[str, Any]:
            rows = conn.execute(
                "SELECT name, value FROM state WHERE conversation_id = ?", (conversation_id,)
            )
            return {name: json.loads(value) for name, value in rows}

        return await self._call(work, write=False)

    # --- submissions ----------------------------------------------------------------------------
    async def admit(self, new: NewSubmission) -> Admission:
        def work(conn: sqlite3.Connection, touched: Touched) -> Admission:
            return _admit(conn, new, touched)

        return await self._call(work, write=True)

    async def get_submission(self, submission_id: str) -> Submission | None:
        def work(conn: sqlite3.Connection, _: Touched) -> Submission | None:
            row = _submission_row(conn, submission_id)
            return None if row is None else _submission(row)

        return await self._call(work, write=False)

    async def list_submissions(
        self, conversation_id: str | None = None, statuses: Sequence[str] | None = None
    ) -> list[Submission]:
        where, args = ["1"], []
        if conversation_id is not None:
            where.append("conversation_id = ?")
            args.append(conversation_id)
        if statuses is not None:
            where.append("status IN (SELECT value FROM json_each(?))")
            args.append(json.dumps(list(statuses)))
        sql = f"SELECT * FROM submissions WHERE {' AND '.join(where)} ORDER BY seq"

        def work(conn: sqlite3.Connection, _: Touched) -> list[Submission]:
            return [_submission(row) for row in conn.execute(sql, args)]

        return await self._call(work, write=False)

    async def claim(
        self,
        owner: str,
        lease_s: float,
        limit: int,
        *,
        now: float | None = None,
        exclude_conversations: Sequence[str] = (),
    ) -> list[Submission]:
        excluded = json.dumps(list(exclude_conversations))

        def work(conn: sqlite3.Connection, _: Touched) -> list[Submission]:
            at = time.time() if now is None else now
            rows = conn.execute(
                _CLAIM,
                {
                    "owner": owner,
                    "expires": at + lease_s,
                    "now": at,
                    "limit": limit,
                    "excluded": excluded,
                },
            ).fetchall()
            return sorted((_submission(row) for row in rows), key=lambda s: s.seq)

        return await self._call(work, write=True)

    async def renew(self, fence: Fence, owner: str, lease_s: float) -> bool:
        def work(conn: sqlite3.Connection, _: Touched) -> bool:
            return _update_lease(conn, fence, owner, time.time() + lease_s)

        return await self._call(work, write=True)

    async def release(self, fence: Fence, owner: str) -> bool:
        def work(conn: sqlite3.Connection, _: Touched) -> bool:
            return _update_lease(conn, fence, owner, 0.0)

        return await self._call(work, write=True)

    async def expire_owners(self, owners: Sequence[str]) -> int:
        """Set the lease of every running submission of these owners to 0 (expired); return how
        many leases were not already at 0."""
        names = json.dumps(list(owners))

        def work(conn: sqlite3.Connection, _: Touched) -> int:
            cursor = conn.execute(
                "UPDATE submissions SET lease_expires_at = 0 WHERE status = ?"
                " AND lease_owner IN (SELECT value FROM json_each(?))"
                " AND (lease_expires_at IS NULL OR lease_expires_at <> 0)",
                (RUNNING, names),
            )
            return cursor.rowcount

        return await self._call(work, write=True)

    async def lease_owners(self) -> list[str]:
        def work(conn: sqlite3.Connection, _: Touched) -> list[str]:
            rows = conn.execute(
                "SELECT DISTINCT lease_owner FROM submissions"
                " WHERE status = ? AND lease_owner IS NOT NULL ORDER BY lease_owner",
                (RUNNING,),
            )
            return [row[0] for row in rows]

        return await self._call(work, write=False)

    async def request_abort(self, conversation_id: str) -> list[str]:
        """Stamp every queued or running submission (an earlier stamp is kept); return their ids
        in admission order, and wake the conversation's waiters."""

        def work(conn: sqlite3.Connection, touched: Touched) -> list[str]:
            unsettled = (conversation_id, QUEUED, RUNNING)
            conn.execute(
                "UPDATE submissions SET abort_requested_at = COALESCE(abort_requested_at, ?)"
                " WHERE conversation_id = ? AND status IN (?, ?)",
                (time.time(), *unsettled),
            )
            rows = conn.execute(
                "SELECT id FROM submissions WHERE conversation_id = ? AND status IN (?, ?)"
                " ORDER BY seq",
                unsettled,
            )
            ids = [row[0] for row in rows]
            if ids:
                touched[conversation_id] = _last_offset(conn, conversation_id)
            return ids

        return await self._call(work, write=True)

    async def settle(
        self,
        fence: Fence,
        record: Record,
        *,
        outcome: str,
        error: dict[str, Any] | None,
        reply: str | None,
        records_before: Sequence[Record] = (),
    ) -> int:
        batch = [*records_before, record]

        def work(conn: sqlite3.Connection, touched: Touched) -> int:
            host = _check_fence(conn, fence)
            conversation_id = host["conversation_id"]
            offset = _append(conn, conversation_id, batch, touched)[-1]
            at = time.time()
            error_json = _json_or_none(error)
            conn.execute(
                "UPDATE submissions SET status = ?, outcome = ?, error = ?, reply = ?,"
                " settled_at = ?, lease_owner = NULL, lease_expires_at = NULL WHERE id = ?",
                (SETTLED, outcome, error_json, reply, at, fence.submission_id),
            )
            joined = conn.execute(
                "SELECT id FROM submissions WHERE joined_to = ? AND status = ?"
                " AND settled_at IS NULL ORDER BY seq",
                (fence.submission_id, JOINED),
            ).fetchall()
            for (sid,) in joined:
                settled = SubmissionSettled(
                    id=f"{sid}:settled",
                    submission_id=sid,
                    outcome=outcome,
                    error=error,
                    reply=reply,
                )
                _append(conn, conversation_id, [settled], touched)
                conn.execute(
                    "UPDATE submissions SET outcome = ?, error = ?, reply = ?, settled_at = ?"
                    " WHERE id = ?",
                    (outcome, error_json, reply, at, sid),
                )
            return offset

        return await self._call(work, write=True)

    async def settle_queued(
        self, submission_id: str, record: Record, *, outcome: str, error: dict[str, Any] | None
    ) -> int | None:
        def work(conn: sqlite3.Connection, touched: Touched) -> int | None:
            row = _submission_row(conn, submission_id)
            if row is None or row["status"] != QUEUED:
                return None
            conn.execute(
                "UPDATE submissions SET status = ?, outcome = ?, error = ?, settled_at = ?"
                " WHERE id = ?",
                (SETTLED, outcome, _json_or_none(error), time.time(), submission_id),
            )
            return _append(conn, row["conversation_id"], [record], touched)[0]

        return await self._call(work, write=True)

    async def join(self, host: Fence, submission_id: str, records: Sequence[Record]) -> bool:
        batch = list(records)

        def work(conn: sqlite3.Connection, touched: Touched) -> bool:
            host_row = _check_fence(conn, host)
            row = _submission_row(conn, submission_id)
            conversation_id = host_row["conversation_id"]
            if row is None or row["status"] != QUEUED or row["conversation_id"] != conversation_id:
                return False
            conn.execute(
                "UPDATE submissions SET status = ?, joined_to = ?, started_at = ? WHERE id = ?",
                (JOINED, host.submission_id, time.time(), submission_id),
            )
            _append(conn, conversation_id, batch, touched)
            return True

        return await self._call(work, write=True)

    # --- the writer thread ----------------------------------------------------------------------


# --- the operations, run on the writer thread ----------------------------------------------------

_CLAIM = """
UPDATE submissions SET
    status = 'running',
    attempt = attempt + 1,
    lease_owner = :owner,
    lease_expires_at = :expires,
    started_at = COALESCE(started_at, :now),
    deadline = COALESCE(deadline, :now + timeout)
WHERE seq IN (
    SELECT s.seq FROM submissions AS s
    WHERE s.status IN ('queued', 'running')
      AND (s.status = 'queued' OR COALESCE(s.lease_expires_at, 0) <= :now)
      AND s.conversation_id NOT IN (SELECT value FROM json_each(:excluded))
      AND s.seq = (
          SELECT MIN(t.seq) FROM submissions AS t
          WHERE t.conversation_id = s.conversation_id AND t.status IN ('queued', 'running'))
      AND NOT EXISTS (
          SELECT 1 FROM submissions AS r
          WHERE r.conversation_id = s.conversation_id AND r.status = 'running'
            AND r.seq <> s.seq)
    ORDER BY s.seq
    LIMIT :limit)
RETURNING *
"""


def _check_fence(conn: sqlite3.Connection, fence: Fence) -> sqlite3.Row:
    row = _submission_row(conn, fence.submission_id)
    if row is None or row["status"] != RUNNING or row["attempt"] != fence.attempt:
        now = "missing" if row is None else f"{row['status']}, attempt {row['attempt']}"
        raise FencedOut(
            f"submission {fence.submission_id} attempt {fence.attempt} no longer owns its work"
            f" (now {now}); this attempt must stop"
        )
    return row


def _append(
    conn: sqlite3.Connection, conversation_id: str, records: list[Record], touched: Touched
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
            "INSERT INTO conversations (conversation_id, agent, parent, last_offset, created_at)"
            " VALUES (?, ?, ?, -1, ?)",
            (conversation_id, created.agent, _json_or_none(created.parent), time.time()),
        )
        last = -1
    else:
        raise StoreError(f"conversation {conversation_id} does not exist; admit a submission first")
    start, offsets = last, []
    for record in records:
        body, digest = record.encode(last + 1)
        inserted = conn.execute(
            'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)'
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                conversation_id,
                last + 1,
                record.id,
                record.type,
                record.submission_id,
                body,
                digest,
            ),
        ).rowcount
        if inserted:
            last += 1
            offsets.append(last)
            if isinstance(record, StateWrite):
                conn.execute(
                    "INSERT INTO state (conversation_id, name, value) VALUES (?, ?, ?)"
                    " ON CONFLICT (conversation_id, name) DO UPDATE SET value = excluded.value",
                    (conversation_id, record.name, _json(record.value)),
                )
            continue
        existing = conn.execute(
            'SELECT "offset", digest FROM records WHERE conversation_id = ? AND id = ?',
            (conversation_id, record.id),
        ).fetchone()
        if existing is None:
            raise StoreError(f"offset {last + 1} of {conversation_id} is taken: corrupt stream")
        if existing[1] != digest:
            raise IntegrityError(
                f"record {record.id} already exists in {conversation_id} (offset {existing[0]})"
                " with different content"
            )
        offsets.append(int(existing[0]))
    if last != start:
        conn.execute(
            "UPDATE conversations SET last_offset = ? WHERE conversation_id = ?",
            (last, conversation_id),
        )
        touched[conversation_id] = last
    return offsets


def _admit(conn: sqlite3.Connection, new: NewSubmission, touched: Touched) -> Admission:
    conversation_id = new.conversation_id
    if _last_offset(conn, conversation_id) < 0:
        created = ConversationCreated(
            id=f"{conversation_id}:created",
            agent=new.agent,
            conversation_id=conversation_id,
            parent=new.parent,
        )
        _append(conn, conversation_id, [created], touched)
    digest = hashlib.sha256(
        json.dumps([new.kind, new.payload], sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    if new.idempotency_key is not None:
        row = conn.execute(
            "SELECT * FROM submissions WHERE conversation_id = ? AND idempotency_key = ?",
            (conversation_id, new.idempotency_key),
        ).fetchone()
        if row is not None:
            if row["payload_digest"] != digest:
                raise IdempotencyConflict(
                    f"idempotency key {new.idempotency_key!r} was already used in"
                    f" {conversation_id} with a different payload; use a new key"
                )
            return Admission(_submission(row), row["admitted_offset"], True)
    offset = _last_offset(conn, conversation_id)
    row = conn.execute(
        "INSERT INTO submissions (id, conversation_id, kind, payload, idempotency_key,"
        " payload_digest, admitted_offset, status, attempt, max_attempts, timeout, accepted_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?) RETURNING *",
        (
            "s_" + uuid.uuid4().hex[:20],
            conversation_id,
            new.kind,
            _json(new.payload),
            new.idempotency_key,
            digest,
            offset,
            QUEUED,
            new.max_attempts,
            new.timeout,
            time.time(),
        ),
    ).fetchone()
    touched[conversation_id] = offset  # wakes the coordinator's ``wait_any``
    return Admission(_submission(row), offset, False)


def _update_lease(conn: sqlite3.Connection, fence: Fence, owner: str, expires: float) -> bool:
    cursor = conn.execute(
        "UPDATE submissions SET lease_expires_at = ?"
        " WHERE id = ? AND status = ? AND attempt = ? AND lease_owner = ?",
        (expires, fence.submission_id, RUNNING, fence.attempt, owner),
    )
    return cursor.rowcount == 1


def _last_offset(conn: sqlite3.Connection, conversation_id: str) -> int:
    row = conn.execute(
        "SELECT last_offset FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    return -1 if row is None else int(row[0])


def _submission_row(conn: sqlite3.Connection, submission_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM submissions WHERE id = ?", (submission_id,)
    ).fetchone()
    return row


def _submission(row: sqlite3.Row) -> Submission:
    return Submission(
        id=row["id"],
        conversation_id=row["conversation_id"],
        kind=row["kind"],
        payload=json.loads(row["payload"]),
        idempotency_key=row["idempotency_key"],
        status=row["status"],
        outcome=row["outcome"],
        error=None if row["error"] is None else json.loads(row["error"]),
        reply=row["reply"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        timeout=float(row["timeout"]),
        deadline=_real(row["deadline"]),
        lease_owner=row["lease_owner"],
        lease_expires_at=_real(row["lease_expires_at"]),
        abort_requested_at=_real(row["abort_requested_at"]),
        accepted_at=float(row["accepted_at"]),
        started_at=_real(row["started_at"]),
        settled_at=_real(row["settled_at"]),
        seq=row["seq"],
        joined_to=row["joined_to"],
    )


def _conversation(row: sqlite3.Row) -> ConversationInfo:
    parent = row["parent"]
    return ConversationInfo(
        conversation_id=row["conversation_id"],
        agent=row["agent"],
        last_offset=row["last_offset"],
        parent=None if parent is None else json.loads(parent),
        extra={"created_at": row["created_at"]},
    )


def _real(value: float | None) -> float | None:
    return None if value is None else float(value)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else _json(value)
