"""The shared store: PostgreSQL, for any number of hearth processes on any hosts.

``PostgresStore`` runs each ``Store`` method as one transaction over a connection from a
``psycopg_pool.AsyncConnectionPool``; the SQL is in ``postgres_ops``, the schema in
``postgres_schema``, the cross-process push in ``postgres_listen``.

A lost connection (server restart, ``pg_terminate_backend``, failover) is retried with backoff.
When it was lost while a write may have committed, the retry first reads back what that write
would have left (its deterministic record ids, its submission id, its claim token) and returns
that instead of writing again. While the database stays unreachable, methods raise
``StoreUnavailable`` (admission within two seconds; fenced writes after ``write_retry_s``).

Example::

    store = PostgresStore("postgresql://hearth@db.internal/hearth", schema="hearth")
    await store.open()
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import PoolTimeout

from hearth import _faults
from hearth._recent import keep_recent
from hearth.errors import ConfigurationError, IntegrityError, StoreError, StoreUnavailable
from hearth.records import Record, WaitStarted
from hearth.store import postgres_ops as ops
from hearth.store import postgres_readback as readback
from hearth.store import postgres_session as session
from hearth.store import postgres_transact as transact
from hearth.store import rules
from hearth.store.base import LIST_LIMIT, Result, Store
from hearth.store.events import ABORT, ADMITTED, APPENDED, RELEASED, Event, StoreEvents
from hearth.store.postgres_deadline import Stalled, within
from hearth.store.postgres_group import GroupAppends, Grouped, GroupItem, group_append
from hearth.store.postgres_listen import Listener, Notes
from hearth.store.postgres_schema import SCHEMA_VERSION, migrate
from hearth.store.postgres_tx import (
    ADMIT_WAIT_S,
    TRY_GRACE_S,
    WORK_TRY_S,
    Resolve,
    Transactions,
    Work,
    answer_by,
    describe,
    first_line,
    look_until,
    open_pool,
    replaced_when_unfit,
    stale_plan,
)
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

T = TypeVar("T")

# Lower case only: PostgreSQL folds an unquoted name to lower case (the search_path given at
# connect time is one), so "Tenant" would be created as one schema and searched as another.
SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
CONNECT_TIMEOUT_S = 5
# How long a new connection's session settings (one round trip) may go unanswered.
SETUP_TRY_S = 5.0
ABORT_LOCK_WAIT_MS = 200  # an abort's wait for a row lock before it tells the row's owner
ABORT_LOCKED_WAIT_MS = 10_000  # and its wait after
log = logging.getLogger("hearth.store")

_SKEW_TTL_S = 30.0
# A reading of the database's clock further than this from what the last one foretold is a step
# of that clock (set back or forward), not the doubt of a round trip.
CLOCK_STEP_S = 1.0
_TAILS_KEPT = 4096


# SQLSTATEs of a server shutting down or starting up (admin_shutdown, crash_shutdown,
# cannot_connect_now): its connections end, and nothing is wrong with what was asked.
_SERVER_GOING = frozenset({"57P01", "57P02", "57P03"})


# The time a fork's copy may take per record, when that is more than ``WORK_TRY_S``: twice
# what a 2-core VM took (14 s for 300,000 records).
FORK_S_PER_RECORD = 0.0001


class PostgresStore(Store):
    """The ``Store`` on one PostgreSQL database, all tables in ``schema``."""

    shared = True  # any number of processes, of one release or two

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "hearth",
        pool_size: int = 10,
        write_retry_s: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not SCHEMA_RE.fullmatch(schema):
            raise ConfigurationError(
                f"schema {schema!r} must be 1-63 lower-case letters, digits or _, not starting"
                " with a digit"
            )
        if pool_size < 1:
            raise ConfigurationError("the PostgreSQL pool needs at least 1 connection")
        self.conninfo = conninfo
        self.where = describe(conninfo)  # the server and database, without credentials
        self.schema = schema
        self.schema_version = SCHEMA_VERSION
        self.pool_size = pool_size
        self.write_retry_s = write_retry_s
        self.clock = clock
        self.events = StoreEvents()
        self.channel = "hearth_" + hashlib.sha256(schema.encode()).hexdigest()[:24]
        self._sender = uuid.uuid4().hex
        # The rest of hearth's settings are SET once connected (``postgres_session``).
        self._kwargs: dict[str, Any] = {
            **session.CONNECT_KWARGS,
            **session.network_kwargs(conninfo),
            "connect_timeout": CONNECT_TIMEOUT_S,
        }
        self._transactions: Transactions | None = None
        self._app_search_path = "public"  # the database's own, read at open (step.transaction)
        # conversation → the last offset this process saw there, for one-statement appends
        self._tails: dict[str, int] = {}
        self._hosts: dict[str, str] = {}  # the conversation of each submission that appended
        # The claims whose step.transaction is open here: each holds its submission's row
        # locked (no peer can claim it meanwhile), so renewals leave those rows alone.
        self._transacting: Counter[Fence] = Counter()
        # One step.transaction of a submission at a time (parallel calls' lock the same row:
        # the second waited for it inside its try, and the wait counted against its time)
        self._one_transaction: dict[str, tuple[asyncio.Lock, int]] = {}
        self._lease_s: float | None = None  # the latest claim's or renewal's lease
        self._conversations: dict[str, None] = {}  # conversations this process admitted to
        self._group = GroupAppends(self._write_group)
        self._admits: Grouped[_Admit, Admission | None] = Grouped(self._admit_group)
        self._notes: Notes | None = None
        self._listener: Listener | None = None
        # (database clock - local monotonic clock, measured at): the database's clock between
        # two readings, advanced by the monotonic clock, so a local wall-clock jump moves nothing
        self._skew: tuple[float, float] | None = None
        self._latest_now = float("-inf")  # the latest time ``now`` answered

    # --- lifecycle ------------------------------------------------------------------------------
    async def open(self, *, create: bool = True) -> None:
        """Connect, create or check the schema (under an advisory lock), start the listener."""
        if self._transactions is not None:
            return
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, **self._kwargs
            )
        except psycopg.ProgrammingError as exc:  # the connection string itself is wrong
            raise ConfigurationError(f"bad PostgreSQL URL: {first_line(exc)}") from None
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to {self.where}: {first_line(exc)}") from None
        try:
            await session.check_server(conn, self.where)
            # This connection has the database's own search_path, which the application's
            # step.transaction functions get (hearth's connections use its schema).
            cursor = await conn.execute("SHOW search_path")
            shown = await cursor.fetchone()
            if shown:
                self._app_search_path = str(shown[0])
            self.schema_found = await migrate(conn, self.schema, create=create)
            await self._check_sessions(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise StoreError(
                f"{self.where}: {first_line(exc)}; grant CREATE on the database to this role, or"
                f" create the schema {self.schema!r} owned by it"
            ) from None
        except psycopg.Error as exc:
            if conn.broken or exc.sqlstate in _SERVER_GOING:
                # The server went away after the connection (a restart, a failover): the same
                # clear error as a refused connection, not a failed migration.
                raise StoreUnavailable(
                    f"cannot connect to {self.where}: the connection was lost while opening:"
                    f" {first_line(exc)}"
                ) from None
            raise StoreError(f"{self.where}: the migration failed: {first_line(exc)}") from None
        finally:
            await conn.close()
        pool = await open_pool(self.conninfo, self._kwargs, self.pool_size, self._configure)
        self._notes = Notes(pool, self.channel, self._sender)
        self._transactions = Transactions(
            pool,
            where=self.where,
            channel=self.channel,
            sender=self._sender,
            events=self.events,
            notes=self._notes,
            connect=self._connect_alone,
        )
        self._listener = Listener(
            self._listening, self.channel, self._sender, self.events, self._missed
        )
        self._listener.start()
        with contextlib.suppress(TimeoutError):  # it keeps trying; polling covers the gap
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await self._listener.connected.wait()

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stop()
        notes, self._notes = self._notes, None
        if notes is not None:
            await notes.close(CONNECT_TIMEOUT_S)
        transactions, self._transactions = self._transactions, None
        if transactions is not None:
            await transactions.close()

    async def ping(self, timeout: float) -> None:
        await self._tx().ping(timeout)

    async def _check_sessions(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """``session.check_sessions`` on ``conn`` and a connection made as the pool's are."""
        try:
            alone = await self._connect_alone(CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to {self.where}: {first_line(exc)}") from None
        async with alone:
            await session.check_sessions(conn, alone, self.schema, self.where)

    async def _connect_alone(self, timeout: float) -> ops.Conn:
        """A connection of its own, as the pool's are made, giving up after ``timeout``."""
        conn: ops.Conn = await self._with_session(
            row_factory=dict_row, connect_timeout=max(2, math.ceil(timeout))
        )
        return conn

    async def _listening(self) -> psycopg.AsyncConnection[Any]:
        """The listener's connection, with hearth's session settings."""
        return await self._with_session()

    async def _with_session(self, **extra: Any) -> psycopg.AsyncConnection[Any]:
        """A new connection outside the pool (``extra``: psycopg's connect arguments over this
        store's), with hearth's session settings applied."""
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, **{**self._kwargs, **extra}
        )
        try:
            await within(conn, session.apply(conn, self.schema), SETUP_TRY_S)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _configure(self, conn: ops.Conn) -> None:
        """The pool's ``configure``: once per new connection, not per statement. (Bounded: a
        server that accepted the connection and then stopped answering held one of the pool's
        few workers for good, and the pool could no longer grow.)"""
        await within(conn, session.apply(conn, self.schema), SETUP_TRY_S)

    async def now(self) -> float:
        if self.clock is not None:
            return self.clock()
        local = time.monotonic()
        if self._skew is None or local - self._skew[1] > _SKEW_TTL_S:
            sent = local

            async def clock(conn: ops.Conn) -> dict[str, Any] | None:
                nonlocal sent
                # Timed from here, the connection in hand: a wait for one (a busy pool) put
                # the middle of the round trip before the database read its clock, and every
                # reading ran ahead by half that wait (a deadline judged passed early).
                sent = time.monotonic()
                return await ops.fetchone(
                    conn, "SELECT extract(epoch FROM clock_timestamp())::float8 AS t", {}
                )

            row = await self._read(clock)
            after = time.monotonic()
            assert row is not None
            self._skew = (float(row["t"]) - (sent + after) / 2, after)
            local = after
        reading = local + self._skew[0]
        if reading < self._latest_now - CLOCK_STEP_S:
            self._stepped(reading - self._latest_now)
            self._latest_now = reading
        # Never behind an answer given before: a new reading, taken from the middle of its
        # round trip, can be a little behind the last one's (a deadline judged passed must
        # stay passed). Further behind, the database's clock was set back: it is followed.
        self._latest_now = max(self._latest_now, reading)
        return self._latest_now

    def _observed(self, at: float, before: float, after: float) -> None:
        """``at``: the database's clock in a statement run between the monotonic ``before``
        and ``after``. A clock that moved against the estimate (set back or forward, past the
        round trip's own doubt) is followed from now on, not after ``_SKEW_TTL_S``: a claim
        stamps its deadline with it, and a stale estimate ahead of it took every new
        submission's deadline for passed (``timeout`` at once)."""
        if self.clock is not None or self._skew is None:
            return
        middle = (before + after) / 2
        moved = at - (middle + self._skew[0])
        if abs(moved) <= max(CLOCK_STEP_S, after - before):
            return
        self._stepped(moved)
        self._skew = (at - middle, after)
        self._latest_now = at

    def _stepped(self, moved: float) -> None:
        log.warning(
            "the clock of %s moved %+.1f s against this process's; hearth follows it",
            self.where,
            moved,
        )

    async def notified(self, timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Wait until the notifications of this store's commits so far are sent (for tests)."""
        if self._notes is not None:
            await self._notes.close(timeout)

    @property
    def listener_pid(self) -> int | None:
        """The backend pid of the listening connection (tests terminate it)."""
        return None if self._listener is None else self._listener.backend_pid

    def _missed(self) -> None:
        # The listener was away: wake the claimers, so that work admitted meanwhile is claimed
        # now rather than at the next scan, and every waiter (streams, long-polls, readers of
        # a settlement), so that each reads what was appended or settled meanwhile now.
        self.events.wake_all()
        self.events.publish(Event(RELEASED, ""))

    # --- transactions ---------------------------------------------------------------------------
    def _now(self) -> float | None:
        return None if self.clock is None else self.clock()

    def _tx(self) -> Transactions:
        if self._transactions is None:
            raise StoreUnavailable("the PostgreSQL store is not open")
        return self._transactions

    async def _read(self, work: Callable[[ops.Conn], Awaitable[T]]) -> T:
        return await self._tx().read(work)

    async def _write(
        self,
        work: Work[T],
        *,
        resolve: Resolve[T] | None = None,
        budget_s: float | None = None,
        idle_is_lost: bool = True,
        try_s: float | None = None,
        overrun_is_final: bool = False,
        answer_by: float | None = None,
    ) -> T:
        budget = self.write_retry_s if budget_s is None else budget_s
        return await self._tx().write(
            work,
            budget_s=budget,
            resolve=resolve,
            idle_is_lost=idle_is_lost,
            try_s=try_s,
            overrun_is_final=overrun_is_final,
            answer_by=answer_by,
        )

    # --- the stream -----------------------------------------------------------------------------
    async def append(
        self, conversation_id: str, records: Sequence[Record], *, fence: Fence | None = None
    ) -> list[int]:
        batch = list(records)
        if fence is not None and batch:
            fast = await self._append_fast(conversation_id, batch, fence)
            if fast is not None:
                return fast

        async def work(conn: ops.Conn, outbox: ops.Outbox) -> list[int]:
            if fence is not None:
                await ops.check_fence(conn, fence)
            return await ops.append(conn, conversation_id, batch, outbox, self._now())

        offsets = await self._write(
            work, resolve=lambda conn: readback.appended_offsets(conn, conversation_id, batch)
        )
        if offsets:
            self._remember_tail(conversation_id, max(offsets))
        return offsets

    async def transact(
        self,
        conversation_id: str,
        fence: Fence,
        work: Callable[[Any], Awaitable[Any]],
        records: Callable[[Any], Sequence[Record]],
        *,
        ids: Sequence[str],
    ) -> list[Record]:
        # Its own transaction, never the one-statement fast path: the application's work runs
        # between the fence check and the insert.
        async def run(conn: ops.Conn, outbox: ops.Outbox) -> list[Record]:
            # From its fence check on, this transaction holds the submission's row locked,
            # until it ends: counted for renew_all meanwhile (never while a retry waits).
            held = False

            def locked() -> None:
                nonlocal held
                held = True
                self._transacting[fence] += 1

            try:
                return await transact.run(
                    conn,
                    conversation_id=conversation_id,
                    fence=fence,
                    work=work,
                    records=records,
                    app_search_path=self._app_search_path,
                    schema=self.schema,
                    outbox=outbox,
                    now=self._now(),
                    locked=locked,
                    lease_s=self._lease_s,
                )
            finally:
                if held:
                    self._transacting[fence] -= 1
                    if self._transacting[fence] <= 0:
                        del self._transacting[fence]

        try:
            # (An application's function idle in its transaction past the timeout is its own
            # doing: a StoreError names it, nothing is run again; so is one past its time.)
            async with self._transaction_of(fence.submission_id):
                stored = await self._write(
                    run,
                    resolve=lambda conn: transact.read_back(conn, conversation_id, ids, fence),
                    idle_is_lost=False,
                    # the application's statements, for as long as the write may take at all
                    try_s=max(self.write_retry_s, WORK_TRY_S),
                    overrun_is_final=True,
                )
        except transact.AppFailure as failure:
            raise failure.error from None
        except psycopg.IntegrityError as exc:
            raise IntegrityError(
                f"{conversation_id}: a record of this transaction exists already: {first_line(exc)}"
            ) from None
        if stored:
            self._remember_tail(conversation_id, max(r.offset for r in stored))
        return stored

    @contextlib.asynccontextmanager
    async def _transaction_of(self, submission_id: str) -> AsyncIterator[None]:
        """Held while a step.transaction of ``submission_id`` runs here."""
        lock, users = self._one_transaction.get(submission_id, (asyncio.Lock(), 0))
        self._one_transaction[submission_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._one_transaction[submission_id]
            if users <= 1:
                del self._one_transaction[submission_id]
            else:
                self._one_transaction[submission_id] = (lock, users - 1)

    async def _append_fast(
        self, conversation_id: str, batch: list[Record], fence: Fence
    ) -> list[int] | None:
        """A fenced append as one statement, when this process knows the conversation's last
        offset; None when the general path must do it (the offset moved, a record id exists,
        the batch writes state, or the connection was lost: that path reads back what is stored
        and writes only what is missing)."""
        keep_recent(self._hosts, fence.submission_id, conversation_id, _TAILS_KEPT)
        expect = self._tails.get(conversation_id)
        if expect is None or not ops.fast_appendable(conversation_id, batch):
            return None
        # Written together with the fast appends of other conversations waiting meanwhile.
        if not await self._group.append(conversation_id, batch, expect, fence):
            self._tails.pop(conversation_id, None)
            return None
        last = expect + len(batch)
        self._appended_alone(conversation_id, last)
        return list(range(expect + 1, last + 1))

    async def _write_group(self, items: list[GroupItem]) -> set[int]:
        """Write one group of fast appends; the indexes of those written (see ``GroupAppends``).
        A group of one is the plain one-statement append."""
        if len(items) == 1:
            [item] = items
            query, params = ops.fast_append(
                item.conversation_id, item.records, item.expect, item.fence, self._now()
            )
        else:
            query, params = group_append(items, self._now())
        try:
            rows = await self._alone(query, params)
        except (psycopg.IntegrityError, psycopg.OperationalError, PoolTimeout):
            return set()
        except psycopg.errors.FeatureNotSupported as exc:
            if stale_plan(exc):
                return set()  # nothing was written: the general path writes them
            raise
        if len(items) == 1:
            written = {0} if rows and rows[0]["added"] == len(items[0].records) else set()
        else:
            written = {row["ix"] for row in rows}
            added = rows[0]["added"] if rows else 0
            if added != sum(len(items[ix].records) for ix in written):
                return set()  # cannot happen; if it did, the general path reads back
        if written:
            _faults.reached("store:commit-done")
            self._tx().progressed()
        return written

    def _remember_tail(self, conversation_id: str, last: int) -> None:
        """Note a last offset seen; a stale one only sends the next append the general way."""
        keep_recent(self._tails, conversation_id, last, _TAILS_KEPT)

    async def read(
        self, conversation_id: str, after: int = -1, limit: int | None = None
    ) -> list[Record]:
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                'SELECT body FROM records WHERE conversation_id = %(c)s AND "offset" > %(a)s'
                ' ORDER BY "offset" LIMIT %(l)s',
                {"c": conversation_id, "a": after, "l": limit},
            )
        )
        found = [stored_record(row["body"], conversation_id) for row in rows]
        if limit is None and found:
            self._remember_tail(conversation_id, found[-1].offset)
        return found

    async def read_page(
        self, conversation_id: str, after: int, limit: int, max_bytes: int
    ) -> tuple[list[Record], bool]:
        # The server sums the sizes, so records past the budget never leave it.
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                'WITH next AS (SELECT "offset", body FROM records'
                ' WHERE conversation_id = %(c)s AND "offset" > %(a)s'
                ' ORDER BY "offset" LIMIT %(l)s + 1),'
                ' sized AS (SELECT "offset", body, row_number() OVER w AS n,'
                " sum(octet_length(body)) OVER w - octet_length(body) AS before"
                ' FROM next WINDOW w AS (ORDER BY "offset"))'
                " SELECT body, (SELECT count(*) FROM sized) AS found FROM sized"
                ' WHERE n <= %(l)s AND before < %(b)s ORDER BY "offset"',
                {"c": conversation_id, "a": after, "l": limit, "b": max_bytes},
            )
        )
        records = [stored_record(row["body"], conversation_id) for row in rows]
        return records, bool(rows) and int(rows[0]["found"]) > len(rows)

    async def last_of_type(self, conversation_id: str, record_type: str) -> Record | None:
        # A type with a partial index of its own is named literally, so that the index serves
        # the query; other types are found by walking the conversation's records from its end.
        if record_type in rules.TYPES_BY_INDEX:
            where = f"type = '{record_type}'"
        else:
            where = "type = %(t)s"
        query = (
            f"SELECT body FROM records WHERE conversation_id = %(c)s AND {where}"
            ' ORDER BY "offset" DESC LIMIT 1'
        )
        row = await self._read(
            lambda conn: ops.fetchone(conn, query, {"c": conversation_id, "t": record_type})
        )
        return None if row is None else stored_record(row["body"], conversation_id)

    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None:
        row = await self._read(
            lambda conn: ops.fetchone(
                conn,
                "SELECT * FROM conversations WHERE conversation_id = %(c)s",
                {"c": conversation_id},
            )
        )
        return None if row is None else conversation_from_row(row)

    async def turn_view(self, conversation_id: str, after: int, submission_id: str) -> TurnView:
        values = {"c": conversation_id, "a": after, "id": submission_id}
        view = await self._read(lambda conn: ops.turn_view(conn, values))
        if view.records:
            self._remember_tail(conversation_id, view.records[-1].offset)
        return view

    async def get_state(self, conversation_id: str) -> dict[str, Any]:
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                "SELECT name, value FROM state WHERE conversation_id = %(c)s",
                {"c": conversation_id},
            )
        )
        return stored_state(((r["name"], r["value"]) for r in rows), conversation_id)

    async def fork(self, source: str, offset: int, target: str) -> ConversationInfo:
        return await self._write(
            lambda conn, outbox: ops.fork(conn, source, offset, target, outbox, self._now()),
            resolve=lambda conn: readback.forked(conn, source, offset, target),
            budget_s=ADMIT_WAIT_S,  # asked for by a caller, who hears 503 soon, as admissions
            # though a long conversation takes its time to copy (about 50 µs a record here)
            try_s=max(WORK_TRY_S, offset * FORK_S_PER_RECORD),
        )

    # --- submissions ----------------------------------------------------------------------------
    async def admit(self, new: NewSubmission) -> Admission:
        sid = rules.new_submission_id()  # chosen here, so an unknown outcome can be read back
        try:
            return await self._admit(new, sid)
        except asyncio.CancelledError:
            # Cancelled as its statement ran (a caller's timeout, a client gone), it may have
            # committed before its events were gathered: claimers look (a wasted look if not).
            if self._transactions is not None:  # (not while the store closes)
                self._transactions.perhaps_committed(
                    [Event(ADMITTED, new.conversation_id, -1, sid)]
                )
            raise

    async def _admit(self, new: NewSubmission, sid: str) -> Admission:
        # One time limit for the whole admission, whichever ways it goes (a group, alone after
        # a lost group, the general path): each with a limit of its own added up to 4.6 s.
        until = time.monotonic() + ADMIT_WAIT_S
        if ops.fast_admittable(new):
            # Written together with the admissions of other conversations waiting meanwhile.
            done: asyncio.Future[Admission | None] = asyncio.get_running_loop().create_future()
            try:
                fast = await self._admits.submit(
                    _Admit(new.conversation_id, new, sid, done, until), until=until
                )
            except _GroupLost:
                # The group's answer was lost: it may have committed. Read back, then admit.
                fast = await self._admit_alone(new, sid, until, uncertain=True)
            except TimeoutError:  # still waiting for a group, none of which wrote it
                raise StoreUnavailable(
                    f"{self._tx().where} did not take the admission within {ADMIT_WAIT_S:g} s"
                ) from None
            if fast is not None:
                return fast
        return await self._write(
            lambda conn, outbox: ops.admit(conn, new, sid, outbox, self._now()),
            resolve=lambda conn: readback.admission(conn, sid),
            budget_s=_left(until),
            answer_by=answer_by(until),
        )

    async def _admit_alone(
        self, new: NewSubmission, sid: str, until: float, *, uncertain: bool = False
    ) -> Admission | None:
        """``admit_fast`` in a round trip of its own (None: the general path answers)."""
        known = new.conversation_id in self._conversations
        admitted = await self._tx().write_once(
            lambda conn, outbox: ops.admit_fast(conn, new, sid, outbox, self._now(), known=known),
            budget_s=_left(until),
            resolve=lambda conn: readback.admission(conn, sid),
            uncertain=uncertain,
            answer_by=answer_by(until),
        )
        if admitted is not None:
            self._known(new.conversation_id)
        return admitted

    async def _admit_group(self, items: list[_Admit]) -> list[Admission | None]:
        """Admit one group (see ``Grouped``). A group of one is the plain one-round-trip
        admission; a larger one is one round trip and one commit for all, and if it fails
        every admission in it goes alone after reading back whether it was written
        (``_GroupLost``). A conversation this process has not admitted to yet is created by its
        admission, unless it exists; the next group knows it."""
        if len(items) == 1:
            [item] = items
            return [await self._admit_alone(item.new, item.submission_id, item.until)]
        tx = self._tx()
        outbox: ops.Outbox = []
        admissions = [
            (item.new, item.submission_id, item.conversation_id in self._conversations)
            for item in items
        ]
        backend, began = 0, 0.0
        try:
            until = min(item.until for item in items)
            async with tx.connection(_left(until)) as conn:
                backend, began = session.server_pid(conn), time.monotonic()
                _faults.reached("store:commit-begin")
                answers = await within(
                    conn,
                    ops.admit_group(conn, admissions, outbox, self._now()),
                    _left(until) + TRY_GRACE_S,
                )
        except (psycopg.Error, PoolTimeout) as exc:
            tx.failed()
            if isinstance(exc, Stalled) and backend:
                # Cut, it may still run on the server (waiting for a conversation's row that a
                # fork holds) and commit after its callers gave up: ended first, so that each
                # reads back for sure whether it was written.
                cut_at = time.monotonic()
                by = look_until(cut_at, until, answer_by(until))
                await tx.session_over(backend, began, cut_at, by)
            raise _GroupLost() from exc
        _faults.reached("store:commit-done")
        tx.committed(outbox)
        for item, answer in zip(items, answers, strict=True):
            if answer is not None:
                self._known(item.conversation_id)
        return answers

    def _known(self, conversation_id: str) -> None:
        """Note a conversation that exists: its next admissions need not create it."""
        keep_recent(self._conversations, conversation_id, None, _TAILS_KEPT)

    async def get_attachment(self, sha256: str, *, with_data: bool = True) -> Blob | None:
        return await self._read(lambda conn: ops.get_attachment(conn, sha256, with_data))

    async def collect_attachments(self, *, dry_run: bool = False) -> list[Blob]:
        return await self._write(lambda conn, _: ops.collect_attachments(conn, dry_run))

    async def get_submission(self, submission_id: str) -> Submission | None:
        row = await self._read(
            lambda conn: ops.fetchone(
                conn, "SELECT * FROM submissions WHERE id = %(id)s", {"id": submission_id}
            )
        )
        return None if row is None else submission_from_row(row)

    async def get_submissions(self, submission_ids: Sequence[str]) -> list[Submission]:
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                "SELECT * FROM submissions WHERE id = ANY(%(ids)b::text[]) ORDER BY seq",
                {"ids": list(submission_ids)},
            )
        )
        return [submission_from_row(row) for row in rows]

    async def list_submissions(
        self,
        conversation_id: str | None = None,
        statuses: Sequence[str] | None = None,
        *,
        after: int = 0,
        limit: int = LIST_LIMIT,
        before: int | None = None,
    ) -> list[Submission]:
        # Two statements, not one with a parameter for the order: the planner walks the index
        # the way the order asks only when the order is written out.
        order = "seq" if before is None else "seq DESC"
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                "SELECT * FROM submissions WHERE seq > %(after)s"
                " AND (%(before)s::bigint IS NULL OR seq < %(before)s)"
                " AND (%(c)s::text IS NULL OR conversation_id = %(c)s)"
                " AND (%(st)b::text[] IS NULL OR status = ANY(%(st)b::text[]))"
                f" ORDER BY {order} LIMIT %(limit)s",
                {
                    "before": before,
                    "after": after,
                    "c": conversation_id,
                    "st": None if statuses is None else list(statuses),
                    "limit": max(limit, 0),
                },
            )
        )
        return [submission_from_row(row) for row in rows]

    async def count_submissions(
        self, conversation_id: str | None = None
    ) -> dict[tuple[str, str | None], int]:
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                "SELECT status, outcome, count(*) AS n FROM submissions"
                " WHERE %(c)s::text IS NULL OR conversation_id = %(c)s GROUP BY status, outcome",
                {"c": conversation_id},
            )
        )
        return {(row["status"], row["outcome"]): int(row["n"]) for row in rows}

    async def latest_settled(
        self, limit: int, conversation_id: str | None = None
    ) -> list[Submission]:
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                "SELECT * FROM submissions WHERE outcome IS NOT NULL"
                " AND (%(c)s::text IS NULL OR conversation_id = %(c)s)"
                " ORDER BY seq DESC LIMIT %(limit)s",
                {"c": conversation_id, "limit": max(limit, 0)},
            )
        )
        return [submission_from_row(row) for row in rows]

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
        args: dict[str, Any] = {"agent": agent, "limit": max(limit, 0)}
        if before is not None:
            args["t"], args["c"] = before
            args["b"] = rules.activity_bucket(before[0])

        async def work(conn: Any) -> list[Any]:
            rows = await ops.fetchall(conn, sql, args)
            if status == ACTIVE and len(rows) < max(limit, 0):
                rows = await ops.fetchall(
                    conn, rules.active_conversations_sql(*shape, _named), args
                )
            return rows

        rows = await self._read(work)
        return rules.newest_first([summary_from_row(row) for row in rows])

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
        token = uuid.uuid4().hex  # names this claim's rows, so an unknown outcome is read back
        self._lease_s = lease_s
        params = {
            "owner": owner,
            "lease_s": lease_s,
            "limit": limit,
            "excluded": list(exclude_conversations),
            "agents": None if agents is None else list(agents),
            "others_after": others_after,
            "aborting_only": aborting_only,
            "token": token,
            "now": self._now(),
        }

        async def work(conn: ops.Conn, _: ops.Outbox) -> list[Submission]:
            before = time.monotonic()
            rows = await ops.fetchall(conn, ops.CLAIM, params)
            if rows:  # the database's clock when it stamped the claims' deadlines and leases
                self._observed(float(rows[0]["claimed_at"]), before, time.monotonic())
            return sorted((submission_from_row(row) for row in rows), key=lambda s: s.seq)

        return await self._write(work, resolve=lambda conn: readback.claimed(conn, token))

    async def renew_all(self, owner: str, lease_s: float) -> list[Held]:
        self._lease_s = lease_s
        # A row that a step.transaction of this process holds locked is left out: the renewal
        # waited for its lock (as long as the application's transaction ran), and meanwhile
        # every other lease of the process ran out and peers took healthy work over. No peer
        # can claim that row while it is locked (claims skip locked rows), so its claim is
        # held; the first heartbeat after the transaction renews it.
        transacting = list(self._transacting)
        busy = [f.submission_id for f in transacting]
        rows = await self._write(
            lambda conn, _: ops.fetchall(
                conn,
                f"UPDATE submissions SET lease_expires_at = {ops.NOW} + %(lease_s)s"
                " WHERE status = %(r)s AND lease_owner = %(o)s"
                " AND NOT (id = ANY(%(busy)b::text[]))"
                " RETURNING id, attempt, abort_requested_at IS NOT NULL AS aborting",
                {"lease_s": lease_s, "r": RUNNING, "o": owner, "busy": busy, "now": self._now()},
            )
        )
        held = [Held(Fence(row["id"], int(row["attempt"])), bool(row["aborting"])) for row in rows]
        return held + [Held(fence) for fence in transacting]

    async def release(self, fence: Fence, owner: str, *, graceful: bool = False) -> bool:
        return await self._write(
            lambda conn, outbox: ops.release(conn, fence, owner, outbox, graceful)
        )

    async def expire_owners(self, owners: Sequence[str]) -> int:
        names = list(owners)
        return await self._write(lambda conn, outbox: ops.expire_owners(conn, names, outbox))

    async def lease_owners(self) -> list[str]:
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                "SELECT DISTINCT lease_owner FROM submissions"
                " WHERE status = %(r)s AND lease_owner IS NOT NULL ORDER BY lease_owner",
                {"r": RUNNING},
            )
        )
        return [row["lease_owner"] for row in rows]

    async def request_abort(self, conversation_id: str) -> list[str]:
        # Asked for by a caller, who hears 503 soon, as admissions. A submission whose
        # step.transaction is open holds its row locked until that transaction ends: its owner
        # is told first, so that it stops the work (the transaction rolls back), then the stamp
        # waits for the row.
        def stamp(wait_ms: int) -> Work[list[str]]:
            return lambda conn, outbox: ops.request_abort(
                conn, conversation_id, outbox, self._now(), lock_wait_ms=wait_ms
            )

        try:
            return await self._write(stamp(ABORT_LOCK_WAIT_MS), budget_s=ADMIT_WAIT_S)
        except ops.RowsLocked:
            await self._tx().announce([Event(ABORT, conversation_id)])
        try:
            return await self._write(
                stamp(ABORT_LOCKED_WAIT_MS),
                budget_s=ADMIT_WAIT_S,
                try_s=ABORT_LOCKED_WAIT_MS / 1000 + ADMIT_WAIT_S,  # the wait for the row, and more
            )
        except ops.RowsLocked:
            raise StoreUnavailable(
                f"{self.where}: the conversation's running step.transaction held its row for"
                f" {ABORT_LOCKED_WAIT_MS / 1000:g} s after it was asked to stop; try again"
            ) from None

    async def settle_batch(self, fence: Fence, batch: list[Record], result: Result) -> int:
        return await self._write(
            lambda conn, outbox: ops.settle(conn, fence, batch, result, outbox, self._now()),
            resolve=lambda conn: readback.settlement(conn, fence, batch[-1]),
        )

    async def join(self, host: Fence, submission_id: str, records: Sequence[Record]) -> bool:
        return await self.join_many(host, [(submission_id, records)]) == 1

    async def join_many(self, host: Fence, joins: Sequence[tuple[str, Sequence[Record]]]) -> int:
        batches = [(submission_id, list(records)) for submission_id, records in joins]
        if not batches:
            return 0
        fast = await self._join_many_fast(host, batches)
        joined = fast or 0
        for submission_id, batch in batches[joined:]:  # the rest one by one, the general way
            # a lost answer of the one query (None): each may have joined, so it is read back
            if not await self._join_general(host, submission_id, batch, uncertain=fast is None):
                break
            joined += 1
        return joined

    async def _join_many_fast(
        self, host: Fence, batches: list[tuple[str, list[Record]]]
    ) -> int | None:
        """Joins in one round trip (``ops.fast_join_many``), when this process appended for
        ``host`` and knows its conversation's last offset, and each input is one plain record:
        how many joined, in order. 0 when the general path must do them (the offset moved, a
        submission is not queued there, the claim is gone: that path tells these apart); None
        when the connection was lost, so that any prefix may have joined."""
        conversation_id = self._hosts.get(host.submission_id)
        expect = None if conversation_id is None else self._tails.get(conversation_id)
        if conversation_id is None or expect is None:
            return 0
        if any(len(b) != 1 or not ops.fast_appendable(conversation_id, b) for _, b in batches):
            return 0
        now, prev = self._now(), None
        statements = []
        for k, (submission_id, batch) in enumerate(batches):
            statements.append(
                ops.fast_join(conversation_id, host, submission_id, batch[0], expect + k, now, prev)
            )
            prev = submission_id
        try:
            dones = await self._alone_run(lambda conn: ops.fast_join_many(conn, statements))
        except psycopg.OperationalError:
            return None
        except (psycopg.IntegrityError, PoolTimeout):
            return 0
        except psycopg.errors.FeatureNotSupported as exc:
            if stale_plan(exc):
                return 0  # one transaction, refused: none joined
            raise
        joined = 0
        while joined < len(dones) and dones[joined] == 2:
            joined += 1
        if joined:
            _faults.reached("store:commit-done")
            self._tx().progressed()
            self._appended_alone(conversation_id, expect + joined)
        return joined

    async def _join_general(
        self, host: Fence, submission_id: str, batch: list[Record], *, uncertain: bool
    ) -> bool:
        """``join`` in a transaction of its own; ``uncertain``: an earlier try's answer was lost,
        so whether it joined is read back first."""
        appended: list[Event] = []  # what the last try appended, for the next fast append

        async def work(conn: ops.Conn, outbox: ops.Outbox) -> bool:
            joined = await ops.join(conn, host, submission_id, batch, outbox, self._now())
            appended[:] = [e for e in outbox if e.kind == APPENDED]
            return joined

        joined = await self._tx().write(
            work,
            budget_s=self.write_retry_s,
            resolve=lambda conn: readback.joined(conn, submission_id, host),
            uncertain=uncertain,
        )
        for event in appended if joined else ():
            self._remember_tail(event.conversation_id, event.offset)
        return joined

    async def _alone(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run one statement as its own transaction (``_alone_run``)."""
        return await self._alone_run(lambda conn: ops.fetchall(conn, query, params))

    async def _alone_run(self, run: Callable[[ops.Conn], Awaitable[T]]) -> T:
        """Run one query as its own transaction on a connection of the pool. A refused
        statement is a ``StoreError``; a lost connection, an existing row or a busy pool is
        raised as psycopg says it, for the caller's general path to settle."""
        try:
            async with (
                self._tx().pool.connection(timeout=ADMIT_WAIT_S) as conn,
                replaced_when_unfit(conn),
            ):
                _faults.reached("store:commit-begin")  # the query is its own transaction
                # (a cut connection is an OperationalError: the general path reads back)
                return await within(conn, run(conn), WORK_TRY_S)
        except (psycopg.IntegrityError, psycopg.OperationalError, PoolTimeout):
            raise
        except psycopg.Error as exc:
            raise StoreError(f"{self.where} refused the operation: {first_line(exc)}") from exc

    def _appended_alone(self, conversation_id: str, last: int) -> None:
        """After a one-statement write: the tail it left, and its ``appended`` event here and
        for peers."""
        self._remember_tail(conversation_id, last)
        self.events.publish(Event(APPENDED, conversation_id, last))
        assert self._notes is not None
        self._notes.add([Event(APPENDED, conversation_id, last)])

    # --- channel deliveries and schedule cursors ------------------------------------------------
    async def admit_delivery(
        self, delivery: NewDelivery, submissions: Sequence[NewSubmission]
    ) -> DeliveryAdmission:
        # ids chosen here, so an unknown outcome can be read back
        chosen = [(new, rules.new_submission_id()) for new in submissions]
        ids = [sid for _, sid in chosen]
        return await self._write(
            lambda conn, outbox: ops.admit_delivery(conn, delivery, chosen, outbox, self._now()),
            resolve=lambda conn: readback.delivery(
                conn, delivery.channel, delivery.delivery_id, ids
            ),
            budget_s=ADMIT_WAIT_S,
        )

    async def fail_delivery(self, delivery: NewDelivery, error: dict[str, Any]) -> StoredDelivery:
        return await self._write(
            lambda conn, _: ops.fail_delivery(conn, delivery, error, self._now())
        )

    async def get_delivery(self, channel: str, delivery_id: str) -> StoredDelivery | None:
        return await self._read(lambda conn: ops.delivery_row(conn, channel, delivery_id))

    async def list_deliveries(
        self, channel: str, *, status: str | None = None, limit: int = LIST_LIMIT
    ) -> list[StoredDelivery]:
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                "SELECT * FROM deliveries WHERE channel = %(ch)s"
                " AND (%(st)s::text IS NULL OR status = %(st)s)"
                " ORDER BY received_at DESC, delivery_id LIMIT %(l)s",
                {"ch": channel, "st": status, "l": max(limit, 0)},
            )
        )
        return [delivery_from_row(row) for row in rows]

    async def open_schedule(self, name: str, spec: str, now: float) -> ScheduleCursor:
        return await self._write(lambda conn, _: ops.open_schedule(conn, name, spec, now))

    async def admit_occurrence(
        self, name: str, spec: str, cursor: float, occurrence: float, new: NewSubmission
    ) -> Admission | None:
        sid = rules.new_submission_id()  # chosen here, so an unknown outcome can be read back
        return await self._write(
            lambda conn, outbox: ops.admit_occurrence(
                conn, name, spec, cursor, occurrence, (new, sid), outbox, self._now()
            ),
            resolve=lambda conn: readback.admission(conn, sid),
            budget_s=ADMIT_WAIT_S,
        )

    async def list_schedules(self) -> list[ScheduleCursor]:
        rows = await self._read(
            lambda conn: ops.fetchall(conn, "SELECT * FROM schedules ORDER BY name", {})
        )
        return [cursor_from_row(row) for row in rows]

    # --- durable waits --------------------------------------------------------------------------
    async def begin_wait(
        self,
        fence: Fence,
        started: Sequence[tuple[str, WaitStarted]],
        carried: Mapping[str, Any] | None = None,
    ) -> None:
        batch = list(started)

        async def work(conn: ops.Conn, outbox: ops.Outbox) -> bool:
            await ops.begin_wait(conn, fence, batch, carried, outbox, self._now())
            return True

        async def paused(conn: ops.Conn) -> bool | None:
            # A lost COMMIT that went through left this attempt's submission waiting (or queued
            # again, when resolved since): nothing else moves a running attempt's row there.
            row = await ops.fetchone(
                conn,
                "SELECT 1 AS ok FROM submissions WHERE id = %(id)s AND attempt = %(a)s"
                " AND status IN ('waiting', 'queued')",
                {"id": fence.submission_id, "a": fence.attempt},
            )
            return None if row is None else True

        await self._write(work, resolve=paused)

    async def resolve_wait(self, conversation_id: str, wait_id: str, value: Any) -> Wait:
        return await self._write(
            lambda conn, outbox: ops.resolve_wait(
                conn, conversation_id, wait_id, value, outbox, self._now()
            ),
            budget_s=ADMIT_WAIT_S,  # asked for by a caller, who hears 503 soon, as admissions
        )

    async def expire_waits(self, limit: int = LIST_LIMIT) -> list[Wait]:
        return await self._write(
            lambda conn, outbox: ops.expire_waits(conn, limit, outbox, self._now())
        )

    async def get_wait(self, conversation_id: str, wait_id: str) -> Wait | None:
        row = await self._read(
            lambda conn: ops.fetchone(
                conn,
                "SELECT * FROM waits WHERE conversation_id = %(c)s AND wait_id = %(w)s",
                {"c": conversation_id, "w": wait_id},
            )
        )
        return None if row is None else wait_from_row(row)

    async def list_waits(
        self, conversation_id: str | None = None, *, after: int = 0, limit: int = LIST_LIMIT
    ) -> list[Wait]:
        rows = await self._read(
            lambda conn: ops.fetchall(
                conn,
                "SELECT * FROM waits WHERE state = %(p)s AND seq > %(after)s"
                " AND (%(c)s::text IS NULL OR conversation_id = %(c)s)"
                " ORDER BY seq LIMIT %(limit)s",
                {"p": WAIT_PENDING, "after": after, "c": conversation_id, "limit": max(limit, 0)},
            )
        )
        return [wait_from_row(row) for row in rows]

    async def next_wait_expiry(self) -> float | None:
        row = await self._read(
            lambda conn: ops.fetchone(
                conn,
                "SELECT min(expires_at) AS t FROM waits"
                " WHERE state = %(p)s AND expires_at IS NOT NULL",
                {"p": WAIT_PENDING},
            )
        )
        return None if row is None or row["t"] is None else float(row["t"])


def _named(name: str) -> str:
    return f"%({name})s"


@dataclass
class _Admit:
    """One admission waiting for its group (``Grouped``)."""

    conversation_id: str
    new: NewSubmission
    submission_id: str
    done: asyncio.Future[Admission | None] = field(repr=False)
    until: float = float("inf")  # time.monotonic() by which its caller hears an answer


def _left(until: float) -> float:
    """What is left of an admission's time (a last short try when nothing is)."""
    return max(0.05, min(ADMIT_WAIT_S, until - time.monotonic()))


class _GroupLost(Exception):
    """A group of admissions failed or lost its answer: each is read back, then goes alone."""
