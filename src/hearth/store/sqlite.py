"""The embedded store: one SQLite file, owned by one process, through one connection.

``SQLiteStore`` turns each ``Store`` method into a closure over the operations in
``sqlite_ops`` and hands it to the ``GroupCommitWriter`` (``sqlite_writer``), which runs it on
the only connection and commits concurrent operations together (on the event loop while commits
are fast, on its thread while they are slow); ``sqlite_schema`` opens the file and keeps its
schema.

Example::

    store = SQLiteStore("hearth.db")
    await store.open()
    new = NewSubmission("support/c-1", "support", "message", {"text": "hi"})
    admission = await store.admit(new)
    await store.close()
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from hearth.errors import ConfigurationError, ConversationExists, StoreError, StoreUnavailable
from hearth.records import Record, WaitStarted
from hearth.store import rules
from hearth.store import sqlite_ops as ops
from hearth.store.base import LIST_LIMIT, Result, Store
from hearth.store.events import StoreEvents
from hearth.store.rows import (
    ACTIVE,
    RUNNING,
    WAIT_PENDING,
    Admission,
    Blob,
    ConversationInfo,
    ConversationSummary,
    DeliveryAdmission,
    Fence,
    Held,
    NewDelivery,
    NewSubmission,
    ScheduleCursor,
    StoredDelivery,
    Submission,
    TurnView,
    Wait,
    conversation_from_row,
    cursor_from_row,
    delivery_from_row,
    stored_record,
    stored_state,
    submission_from_row,
    summary_from_row,
    wait_from_row,
)
from hearth.store.sqlite_schema import SCHEMA_VERSION, connect
from hearth.store.sqlite_writer import FileWatch, GroupCommitWriter, Outbox, Work

T = TypeVar("T")

_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
_IDS_PER_QUERY = 500  # well under SQLite's limit of bound parameters
# The files this process's stores hold open (real path → how many): a second store of the same
# file would be told another process owns it, when this one does.
_OPEN_HERE: dict[str, int] = {}


# A stream's records, of a conversation that exists: a fork stopped half-way leaves copies under
# an id with no conversation (``SQLiteStore.fork``), which no reader sees.
_STREAM = (
    'SELECT body FROM records WHERE conversation_id = ?1 AND "offset" > ?2'
    " AND EXISTS (SELECT 1 FROM conversations WHERE conversation_id = ?1)"
    ' ORDER BY "offset" LIMIT ?3'
)


def _records(
    conn: sqlite3.Connection, conversation_id: str, after: int, limit: int | None
) -> list[Record]:
    rows = conn.execute(_STREAM, (conversation_id, after, -1 if limit is None else limit))
    try:
        return [stored_record(row[0], conversation_id) for row in rows]
    finally:
        rows.close()  # (a record that cannot be read: its traceback kept the cursor, and the
        # file locked after the store closed)


def _page(
    conn: sqlite3.Connection, conversation_id: str, after: int, limit: int, max_bytes: int
) -> tuple[list[Record], bool]:
    rows = conn.execute(_STREAM, (conversation_id, after, limit + 1))
    try:
        found: list[Record] = []
        total = 0
        for (body,) in rows:  # one row at a time: what is past the budget is never decoded
            if len(found) >= limit or total >= max_bytes:
                return found, True
            found.append(stored_record(body, conversation_id))
            total += len(body)
        return found, False
    finally:
        rows.close()  # an unfinished statement would keep its read transaction open


def _state(conn: sqlite3.Connection, conversation_id: str) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT name, value FROM state WHERE conversation_id = ?", (conversation_id,)
    ).fetchall()
    return stored_state(rows, conversation_id)


def steady_clock() -> Callable[[], float]:
    """Unix seconds that follow the monotonic clock from now on, not later wall-clock jumps."""
    wall, steady = time.time(), time.monotonic()
    return lambda: wall + (time.monotonic() - steady)


class SQLiteStore(Store):
    """The ``Store`` on one SQLite file (``":memory:"`` for a private in-memory database).

    ``clock`` is the store's clock: unix seconds read once and then advanced by the monotonic
    clock, so a jump of the wall clock while the process runs moves no lease and no deadline
    (a test may inject another). ``commits`` and
    ``ops`` count committed transactions and executed operations, so the effect of group commit
    can be observed.
    """

    def __init__(
        self, path: str, *, synchronous: str = "FULL", clock: Callable[[], float] | None = None
    ) -> None:
        mode = synchronous.upper()
        if mode not in _SYNC_MODES:
            raise ConfigurationError(
                f"synchronous must be one of {', '.join(_SYNC_MODES)}, not {synchronous!r}"
            )
        self.path = path
        self._opened_as: str | None = None  # its real path while open (``_OPEN_HERE``)
        self.synchronous = mode
        self.clock = clock or steady_clock()
        # Its clock is the wall clock read at start, then the monotonic one: leases and
        # deadlines ignore a wall clock set right while the process runs (the scheduler,
        # whose cron is wall time, does not use it).
        self.steady = clock is None
        self.events = StoreEvents()
        self._create = True
        self._forking: set[str] = set()  # fork targets being copied (``fork``)
        self.schema_version = SCHEMA_VERSION
        self._writer = GroupCommitWriter(
            lambda: connect(path, mode, create=self._create, found=self._found),
            self.events,
            lambda: None if path == ":memory:" else FileWatch(path),
        )

    def _found(self, version: int | None) -> None:
        self.schema_found = version

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
    async def open(self, *, create: bool = True) -> None:
        """Open the file, take ownership of it and create or check the schema (the migration)."""
        if not create and (
            self.path == ":memory:" or not await asyncio.to_thread(os.path.exists, self.path)
        ):
            raise StoreError(f"there is no database at {self.path}: check --db (or HEARTH_DB)")
        self._create = create
        where = None
        if self.path != ":memory:":
            where = await asyncio.to_thread(os.path.realpath, self.path)
        if where is not None and where in _OPEN_HERE and not self._writer.running:
            raise StoreError(
                f"the SQLite file {self.path} is open in this process already (another runtime"
                " or store of it holds it): close that one first, or use it; a SQLite file"
                " belongs to one store"
            )
        await self._writer.start()
        if where is not None and self._opened_as is None:
            self._opened_as = where
            _OPEN_HERE[where] = _OPEN_HERE.get(where, 0) + 1

    async def close(self) -> None:
        """Finish the queued work, stop the writer thread and close the file. Idempotent."""
        await self._writer.stop()
        where, self._opened_as = self._opened_as, None
        if where is not None:
            _OPEN_HERE[where] -= 1
            if _OPEN_HERE[where] <= 0:
                del _OPEN_HERE[where]

    async def now(self) -> float:
        return self.clock()

    async def ping(self, timeout: float) -> None:
        gone = self._writer.database_gone()
        if gone is not None:
            raise StoreUnavailable(gone)
        try:
            async with asyncio.timeout(timeout):
                await self._read(lambda conn: conn.execute("SELECT 1").fetchone())
        except TimeoutError:
            raise StoreUnavailable(
                f"the SQLite file {self.path} gave no answer within {timeout:g} s"
            ) from None

    def pause_writer(self) -> None:
        """Test hook: the writer thread takes no new group until ``resume_writer``."""
        self._writer.pause()

    def resume_writer(self) -> None:
        self._writer.resume()

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self._writer.call(lambda conn, _: work(conn), write=False)

    async def _write(self, work: Work[T]) -> T:
        return await self._writer.call(work, write=True)

    # --- the stream -----------------------------------------------------------------------------
    async def append(
        self, conversation_id: str, records: Sequence[Record], *, fence: Fence | None = None
    ) -> list[int]:
        batch = list(records)

        def work(conn: sqlite3.Connection, outbox: Outbox) -> list[int]:
            return ops.append(conn, conversation_id, batch, outbox, self.clock(), fence)

        return await self._write(work)

    async def transact(
        self,
        conversation_id: str,
        fence: Fence,
        work: Callable[[Any], Awaitable[Any]],
        records: Callable[[Any], Sequence[Record]],
        *,
        ids: Sequence[str],
    ) -> list[Record]:
        # One process owns the file through one connection: no application connection can
        # share hearth's transaction here.
        raise ConfigurationError(
            "step.transaction needs hearth's store on PostgreSQL (db='postgresql://...'), where"
            " the application's tables live in the same database; on SQLite use step.do"
        )

    async def read(
        self, conversation_id: str, after: int = -1, limit: int | None = None
    ) -> list[Record]:
        def work(conn: sqlite3.Connection, _: Outbox | None = None) -> list[Record]:
            return _records(conn, conversation_id, after, limit)

        if after < 0 and limit is None:
            # A whole stream (a snapshot, an export) may be long: decoded on the writer thread,
            # never on the event loop, where every request would wait for it.
            return await self._writer.call(work, write=False, inline=False)
        return await self._read(work)

    async def read_page(
        self, conversation_id: str, after: int, limit: int, max_bytes: int
    ) -> tuple[list[Record], bool]:
        return await self._read(lambda conn: _page(conn, conversation_id, after, limit, max_bytes))

    async def last_offset(self, conversation_id: str) -> int:
        """The last offset of the stream, -1 when empty or unknown (not part of ``Store``)."""
        return await self._read(lambda conn: ops.last_offset(conn, conversation_id))

    async def last_of_type(self, conversation_id: str, record_type: str) -> Record | None:
        # A type with a partial index of its own is named literally, so that the index serves
        # the query; other types are found by walking the conversation's records from its end.
        if record_type in rules.TYPES_BY_INDEX:
            query = f"SELECT body FROM records WHERE conversation_id = ? AND type = '{record_type}'"
            params: tuple[str, ...] = (conversation_id,)
        else:
            query = "SELECT body FROM records WHERE conversation_id = ? AND type = ?"
            params = (conversation_id, record_type)

        def work(conn: sqlite3.Connection) -> Record | None:
            row = conn.execute(f'{query} ORDER BY "offset" DESC LIMIT 1', params).fetchone()
            return None if row is None else stored_record(row[0], conversation_id)

        return await self._read(work)

    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None:
        def work(conn: sqlite3.Connection) -> ConversationInfo | None:
            row = conn.execute(
                "SELECT * FROM conversations WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
            return None if row is None else conversation_from_row(row)

        return await self._read(work)

    async def get_state(self, conversation_id: str) -> dict[str, Any]:
        return await self._read(lambda conn: _state(conn, conversation_id))

    async def turn_view(self, conversation_id: str, after: int, submission_id: str) -> TurnView:
        def work(conn: sqlite3.Connection) -> TurnView:
            records = _records(conn, conversation_id, after, None)
            row = ops.submission_row(conn, submission_id)
            submission = None if row is None else submission_from_row(row)
            return TurnView(records, _state(conn, conversation_id), submission)

        return await self._read(work)  # one hand-off to the store's thread for the three

    async def fork(self, source: str, offset: int, target: str) -> ConversationInfo:
        # In chunks (``ops.FORK_CHUNK`` records a job, on the writer thread): other writes run
        # between them. ``target`` exists only once the last job commits; a crash before leaves
        # copies under an id with no conversation, which the next creation of it clears.
        if target in self._forking:
            raise ConversationExists(f"conversation {target!r} is being forked; fork to a new id")
        self._forking.add(target)
        try:

            async def job(work: Callable[[sqlite3.Connection, Outbox], T]) -> T:
                return await self._writer.call(work, write=True, inline=False)

            agent = await job(lambda conn, _: ops.fork_begin(conn, source, offset, target))
            copy = ops.ForkCopy()
            for after in range(0, offset, ops.FORK_CHUNK):
                upto = min(after + ops.FORK_CHUNK, offset)
                await job(functools.partial(ops.fork_copy, source=source, target=target,
                                            after=after, upto=upto, copy=copy))  # fmt: skip
            return await job(
                lambda conn, outbox: ops.fork_finish(
                    conn, source, offset, target, agent, copy, outbox, self.clock()
                )
            )
        finally:
            self._forking.discard(target)

    # --- submissions ----------------------------------------------------------------------------
    async def admit(self, new: NewSubmission) -> Admission:
        return await self._write(lambda conn, outbox: ops.admit(conn, new, outbox, self.clock()))

    async def get_attachment(self, sha256: str, *, with_data: bool = True) -> Blob | None:
        return await self._read(lambda conn: ops.get_attachment(conn, sha256, with_data))

    async def collect_attachments(self, *, dry_run: bool = False) -> list[Blob]:
        return await self._write(lambda conn, _: ops.collect_attachments(conn, dry_run))

    async def get_submission(self, submission_id: str) -> Submission | None:
        def work(conn: sqlite3.Connection) -> Submission | None:
            row = ops.submission_row(conn, submission_id)
            return None if row is None else submission_from_row(row)

        return await self._read(work)

    async def get_submissions(self, submission_ids: Sequence[str]) -> list[Submission]:
        ids = list(dict.fromkeys(submission_ids))

        def work(conn: sqlite3.Connection) -> list[Submission]:
            found: list[Submission] = []
            for start in range(0, len(ids), _IDS_PER_QUERY):
                chunk = ids[start : start + _IDS_PER_QUERY]
                marks = ", ".join("?" * len(chunk))
                sql = f"SELECT * FROM submissions WHERE id IN ({marks})"
                found += (submission_from_row(row) for row in conn.execute(sql, chunk))
            return sorted(found, key=lambda s: s.seq)

        return await self._read(work)

    async def list_submissions(
        self,
        conversation_id: str | None = None,
        statuses: Sequence[str] | None = None,
        *,
        after: int = 0,
        limit: int = LIST_LIMIT,
        before: int | None = None,
    ) -> list[Submission]:
        where = ["seq > ?"]
        args: list[object] = [after]
        if before is not None:
            where.append("seq < ?")
            args.append(before)
        if conversation_id is not None:
            where.append("conversation_id = ?")
            args.append(conversation_id)
        if statuses is not None:
            where.append("status IN (SELECT value FROM json_each(?))")
            args.append(json.dumps(list(statuses)))
        order = "seq" if before is None else "seq DESC"
        sql = f"SELECT * FROM submissions WHERE {' AND '.join(where)} ORDER BY {order} LIMIT ?"

        def work(conn: sqlite3.Connection) -> list[Submission]:
            return [submission_from_row(row) for row in conn.execute(sql, [*args, max(limit, 0)])]

        return await self._read(work)

    async def count_submissions(
        self, conversation_id: str | None = None
    ) -> dict[tuple[str, str | None], int]:
        where, args = (
            ("WHERE conversation_id = ?", [conversation_id]) if conversation_id else ("", [])
        )
        sql = f"SELECT status, outcome, count(*) FROM submissions {where} GROUP BY status, outcome"

        def work(conn: sqlite3.Connection) -> dict[tuple[str, str | None], int]:
            return {(row[0], row[1]): int(row[2]) for row in conn.execute(sql, args)}

        return await self._read(work)

    async def latest_settled(
        self, limit: int, conversation_id: str | None = None
    ) -> list[Submission]:
        where = "outcome IS NOT NULL" + (" AND conversation_id = ?" if conversation_id else "")
        args: list[object] = [conversation_id] if conversation_id else []
        sql = f"SELECT * FROM submissions WHERE {where} ORDER BY seq DESC LIMIT ?"

        def work(conn: sqlite3.Connection) -> list[Submission]:
            rows = conn.execute(sql, [*args, max(limit, 0)])
            return [submission_from_row(row) for row in rows]

        return await self._read(work)

    async def list_conversations(
        self,
        agent: str | None = None,
        status: str | None = None,
        *,
        before: tuple[float, str] | None = None,
        limit: int = LIST_LIMIT,
    ) -> list[ConversationSummary]:
        shape = (agent is not None, before is not None)
        sql = rules.conversation_list_sql(shape[0], status, shape[1], _named)
        args: dict[str, object] = {"agent": agent, "limit": max(limit, 0)}
        if before is not None:
            args["t"], args["c"] = before
            args["b"] = rules.activity_bucket(before[0])

        def work(conn: sqlite3.Connection) -> list[ConversationSummary]:
            rows = conn.execute(sql, args).fetchall()
            if status == ACTIVE and len(rows) < max(limit, 0):
                rows = conn.execute(rules.active_conversations_sql(*shape, _named), args).fetchall()
            return rules.newest_first([summary_from_row(row) for row in rows])

        return await self._read(work)

    async def claim(
        self,
        owner: str,
        lease_s: float,
        limit: int,
        *,
        exclude_conversations: Sequence[str] = (),
        agents: Sequence[str] | None = None,
        others_after: float = 0.0,
        aborting_only: bool = False,
    ) -> list[Submission]:
        excluded = json.dumps(list(exclude_conversations))
        declared = None if agents is None else json.dumps(list(agents))

        def work(conn: sqlite3.Connection, _: Outbox) -> list[Submission]:
            at = self.clock()
            params = {
                "owner": owner,
                "expires": at + lease_s,
                "now": at,
                "limit": limit,
                "excluded": excluded,
                "agents": declared,
                "others_before": at - others_after,
                "aborting_only": int(aborting_only),
            }
            rows = conn.execute(ops.CLAIM, params).fetchall()
            return sorted((submission_from_row(row) for row in rows), key=lambda s: s.seq)

        return await self._write(work)

    async def renew_all(self, owner: str, lease_s: float) -> list[Held]:
        def work(conn: sqlite3.Connection, _: Outbox) -> list[Held]:
            rows = conn.execute(
                "UPDATE submissions SET lease_expires_at = ?"
                " WHERE status = ? AND lease_owner = ?"
                " RETURNING id, attempt, abort_requested_at IS NOT NULL",
                (self.clock() + lease_s, RUNNING, owner),
            )
            return [Held(Fence(sid, attempt), bool(abort)) for sid, attempt, abort in rows]

        return await self._write(work)

    async def release(self, fence: Fence, owner: str, *, graceful: bool = False) -> bool:
        return await self._write(
            lambda conn, outbox: ops.release(conn, fence, owner, outbox, graceful)
        )

    async def expire_owners(self, owners: Sequence[str]) -> int:
        """Set the lease of every running submission of these owners to 0 (expired); return how
        many leases were not already at 0."""
        names = list(owners)
        return await self._write(lambda conn, outbox: ops.expire_owners(conn, names, outbox))

    async def lease_owners(self) -> list[str]:
        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT DISTINCT lease_owner FROM submissions"
                " WHERE status = ? AND lease_owner IS NOT NULL ORDER BY lease_owner",
                (RUNNING,),
            )
            return [row[0] for row in rows]

        return await self._read(work)

    async def request_abort(self, conversation_id: str) -> list[str]:
        return await self._write(
            lambda conn, outbox: ops.request_abort(conn, conversation_id, outbox, self.clock())
        )

    async def settle_batch(self, fence: Fence, batch: list[Record], result: Result) -> int:
        return await self._write(
            lambda conn, outbox: ops.settle(conn, fence, batch, result, outbox, self.clock())
        )

    async def join(self, host: Fence, submission_id: str, records: Sequence[Record]) -> bool:
        batch = list(records)
        return await self._write(
            lambda conn, outbox: ops.join(conn, host, submission_id, batch, outbox, self.clock())
        )

    async def join_many(self, host: Fence, joins: Sequence[tuple[str, Sequence[Record]]]) -> int:
        batches = [(submission_id, list(records)) for submission_id, records in joins]

        def work(conn: sqlite3.Connection, outbox: Outbox) -> int:  # one transaction, one commit
            joined = 0
            for submission_id, batch in batches:
                if not ops.join(conn, host, submission_id, batch, outbox, self.clock()):
                    break
                joined += 1
            return joined

        return await self._write(work)

    # --- channel deliveries and schedule cursors ------------------------------------------------
    async def admit_delivery(
        self, delivery: NewDelivery, submissions: Sequence[NewSubmission]
    ) -> DeliveryAdmission:
        subs = list(submissions)
        return await self._write(
            lambda conn, outbox: ops.admit_delivery(conn, delivery, subs, outbox, self.clock())
        )

    async def fail_delivery(self, delivery: NewDelivery, error: dict[str, Any]) -> StoredDelivery:
        return await self._write(
            lambda conn, _: ops.fail_delivery(conn, delivery, error, self.clock())
        )

    async def get_delivery(self, channel: str, delivery_id: str) -> StoredDelivery | None:
        return await self._read(lambda conn: ops.delivery_row(conn, channel, delivery_id))

    async def list_deliveries(
        self, channel: str, *, status: str | None = None, limit: int = LIST_LIMIT
    ) -> list[StoredDelivery]:
        def work(conn: sqlite3.Connection) -> list[StoredDelivery]:
            rows = conn.execute(
                "SELECT * FROM deliveries WHERE channel = ? AND (? IS NULL OR status = ?)"
                " ORDER BY received_at DESC, delivery_id LIMIT ?",
                (channel, status, status, max(limit, 0)),
            )
            return [delivery_from_row(row) for row in rows]

        return await self._read(work)

    async def open_schedule(self, name: str, spec: str, now: float) -> ScheduleCursor:
        return await self._write(lambda conn, _: ops.open_schedule(conn, name, spec, now))

    async def admit_occurrence(
        self, name: str, spec: str, cursor: float, occurrence: float, new: NewSubmission
    ) -> Admission | None:
        return await self._write(
            lambda conn, outbox: ops.admit_occurrence(
                conn, name, spec, cursor, occurrence, new, outbox, self.clock()
            )
        )

    async def list_schedules(self) -> list[ScheduleCursor]:
        def work(conn: sqlite3.Connection) -> list[ScheduleCursor]:
            rows = conn.execute("SELECT * FROM schedules ORDER BY name")
            return [cursor_from_row(row) for row in rows]

        return await self._read(work)

    # --- durable waits --------------------------------------------------------------------------
    async def begin_wait(
        self,
        fence: Fence,
        started: Sequence[tuple[str, WaitStarted]],
        carried: Mapping[str, Any] | None = None,
    ) -> None:
        batch = list(started)
        await self._write(
            lambda conn, outbox: ops.begin_wait(conn, fence, batch, carried, outbox, self.clock())
        )

    async def resolve_wait(self, conversation_id: str, wait_id: str, value: Any) -> Wait:
        return await self._write(
            lambda conn, outbox: ops.resolve_wait(
                conn, conversation_id, wait_id, value, outbox, self.clock()
            )
        )

    async def expire_waits(self, limit: int = LIST_LIMIT) -> list[Wait]:
        return await self._write(
            lambda conn, outbox: ops.expire_waits(conn, limit, outbox, self.clock())
        )

    async def get_wait(self, conversation_id: str, wait_id: str) -> Wait | None:
        def work(conn: sqlite3.Connection) -> Wait | None:
            row = conn.execute(
                "SELECT * FROM waits WHERE conversation_id = ? AND wait_id = ?",
                (conversation_id, wait_id),
            ).fetchone()
            return None if row is None else wait_from_row(row)

        return await self._read(work)

    async def list_waits(
        self, conversation_id: str | None = None, *, after: int = 0, limit: int = LIST_LIMIT
    ) -> list[Wait]:
        def work(conn: sqlite3.Connection) -> list[Wait]:
            # The state is written out, so the partial index of pending waits serves the query
            # of all of them; one conversation's are found through its key (with the two in one
            # statement, SQLite walked every pending wait for one conversation's).
            pending = f"SELECT * FROM waits WHERE state = '{WAIT_PENDING}' AND seq > ?"
            if conversation_id is None:
                rows = conn.execute(f"{pending} ORDER BY seq LIMIT ?", (after, max(limit, 0)))
            else:
                rows = conn.execute(
                    f"{pending} AND conversation_id = ? ORDER BY seq LIMIT ?",
                    (after, conversation_id, max(limit, 0)),
                )
            return [wait_from_row(row) for row in rows]

        return await self._read(work)

    async def next_wait_expiry(self) -> float | None:
        def work(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(
                f"SELECT MIN(expires_at) FROM waits WHERE state = '{WAIT_PENDING}'"
                " AND expires_at IS NOT NULL"
            ).fetchone()
            return None if row is None or row[0] is None else float(row[0])

        return await self._read(work)


def _named(name: str) -> str:
    return f":{name}"
