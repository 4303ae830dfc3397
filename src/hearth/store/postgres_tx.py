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
import contextlib
import contextvars
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from hearth import _faults
from hearth._tasks import cancel_and_wait, cancel_count, cancellation_kept
from hearth.errors import HearthError, StoreError, StoreUnavailable
from hearth.store import postgres_ops as ops
from hearth.store import postgres_readback as readback
from hearth.store import postgres_session as session
from hearth.store.events import ABORT, Event, StoreEvents
from hearth.store.postgres_deadline import Stalled, within
from hearth.store.postgres_listen import Notes, encode_all
from hearth.store.postgres_stranded import Tries

T = TypeVar("T")
log = logging.getLogger("hearth.store.postgres")
Work = Callable[[ops.Conn, ops.Outbox], Awaitable[T]]
Resolve = Callable[[ops.Conn], Awaitable[T | None]]

ADMIT_WAIT_S = 1.5  # admission gives up within two seconds, so HTTP answers 503 quickly
READ_RETRY_S = 10.0
# How long a caller queues for a connection while every connection of the pool is in use: a
# burst of work is slow, not a server that cannot be reached.
POOL_BUSY_S = 30.0
RECONNECT_S = 3.0
MAX_CONFLICT_RETRIES = 5  # tries after a deadlock, past the budget, before giving up
# How long a caller already queued for a busy pool gives the server to answer on a new
# connection of its own before calling it unreachable (a loaded machine opens them slowly).
PROBE_TIMEOUT_S = 5.0
# On a slow link (a round trip of 500 ms), how many of the fastest recent try's time the server
# may take to show it answers: a new connection's handshake, authentication, settings and
# question, with room to spare. On a fast link, an admission's budget is the bound instead.
LINK_ROUND_TRIPS = 8
# How many round trips a try of a short budget may take on a slow link before it is cut, up to
# PROBE_TIMEOUT_S: a wait's resolve or an abort makes a dozen, one after another (on a link of
# 150 ms they took longer than their 1.5 s budget, and were cut and answered 503 every time).
TRY_ROUND_TRIPS = 20
_TRIES_KEPT = 20
_STALE_PLAN = "cached plan must not change result type"

# How long one try of a piece of work may go without an answer before its connection is cut
# and the work retried on another (or given up). Admissions, a ping and what else a caller is
# waiting for get what is left of their own short budget (so HTTP answers 503 within 2 s); the
# rest get limits that only a connection nobody answers on reaches: a read of a page or a blob
# takes milliseconds on a live server, a step.transaction runs the application's statements for
# seconds (the server ends one idle for IDLE_IN_TRANSACTION_MS), a fork copies a conversation.
READ_TRY_S = 5.0
WORK_TRY_S = 30.0
# Past its budget, how long an admission's try may still run: a budget of 1.5 s is an answer
# within 2 s.
TRY_GRACE_S = 0.3
POOL_CLOSE_S = 1.0
# How often tries waiting longer than ``patience`` are looked at (``_sweep``).
_SWEEP_S = 0.5
# How long ending a session whose try was cut may take (``_end_backend``).
END_BACKEND_S = 2.0
# How long a write given up on after a cut try may take, past its budget and grace, to find out
# what that try wrote (``look_after_cut``): on a server that answers, a few milliseconds.
LOOK_AFTER_CUT_S = 0.2
# The least time a caller past its answer's time gives the server to show it answers (a new
# connection and a question, on a fast link).
PROBE_AT_LEAST_S = 0.25
# From an admission's start to its answer at the latest (``answer_by``): its budget, its try's
# grace, a look after a cut.
ANSWER_WINDOW_S = ADMIT_WAIT_S + TRY_GRACE_S + LOOK_AFTER_CUT_S
# Looks after cut tries at once, each on a connection of its own.
LOOKS_AT_ONCE = 8
# A session a cut try ran on, still running what that try sent: not one a pooler (pgbouncer in
# session mode) gave to another client since (that one began after the cut), and not one whose
# commit waits for a synchronous standby (ended there, the commit would stand on the primary
# alone, never confirmed).
_STILL_OURS = (
    "coalesce(xact_start, query_start) <= clock_timestamp() - make_interval(secs => %(ago)s)"
)
_TERMINATE = (
    "SELECT pg_terminate_backend(pid{wait}) AS ended FROM pg_stat_activity"
    " WHERE pid = %(pid)s AND {state} AND pid <> pg_backend_pid()"
    f" AND {_STILL_OURS} AND wait_event IS DISTINCT FROM 'SyncRep'"
)
# When an abort whose caller was cancelled is looked for (after a pause of each, in seconds).
ABORT_READ_BACK_S = (0.0, 0.25, 1.0)


def stale_plan(exc: BaseException) -> bool:
    """Whether ``exc`` refuses a statement that its connection prepared before the table it
    reads changed shape (a newer release's migration adding a column, during a rolling
    redeploy): psycopg prepares a statement once it has run a few times, and a ``SELECT *``
    prepared then no longer fits. The refused statement did not run; on a new connection it
    succeeds."""
    return isinstance(exc, psycopg.errors.FeatureNotSupported) and _STALE_PLAN in str(exc)


@contextlib.asynccontextmanager
async def replaced_when_unfit(conn: ops.Conn) -> AsyncIterator[None]:
    """Close ``conn`` if the work on it met a stale plan (``stale_plan``) or a read-only
    session: the pool then opens a new connection in its place, which prepares its statements
    afresh, or reaches the writable server (a failover's new primary). A read-only session is
    raised as ``ReadOnlyServer``, tried again as a lost connection is."""
    try:
        yield
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        await conn.close()
        raise ReadOnlyServer(
            f"{first_line(exc)} (the server is read-only: a standby, after a failover?)"
        ) from exc
    except psycopg.Error as exc:
        if stale_plan(exc):
            log.warning(
                "a statement prepared on a PostgreSQL connection no longer fits its table (the"
                " schema changed: a newer release migrated it?); that connection is replaced"
            )
            await conn.close()
        raise


class ReadOnlyServer(psycopg.OperationalError):
    """A write met a read-only session (a standby after a failover, a database set read-only
    for maintenance): nothing of it committed, and it is tried again on a new connection, as
    after a lost one; a server that stays read-only is an outage (``StoreUnavailable``)."""


class _Pool(AsyncConnectionPool[ops.Conn]):
    """psycopg's pool, whose waits do not lose a cancellation (``cancellation_kept``)."""

    async def getconn(self, timeout: float | None = None) -> ops.Conn:
        asked = cancel_count()
        conn = await super().getconn(timeout)
        try:
            cancellation_kept(asked)
        except asyncio.CancelledError:
            await asyncio.shield(self.putconn(conn))
            raise
        return conn


async def open_pool(
    conninfo: str,
    connect_kwargs: dict[str, Any],
    size: int,
    configure: Callable[[ops.Conn], Awaitable[None]],
) -> AsyncConnectionPool[ops.Conn]:
    pool: AsyncConnectionPool[ops.Conn] = _Pool(
        conninfo,
        min_size=1,
        max_size=size,
        kwargs={**connect_kwargs, "autocommit": True, "row_factory": dict_row},
        configure=configure,
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
    hosts = str(info.get("host") or "localhost").split(",")
    ports = str(info.get("port") or "5432").split(",")
    if len(ports) == 1:  # (one port for every host, as libpq reads it)
        ports *= len(hosts)
    servers = ",".join(
        f"{h or 'localhost'}:{p or 5432}" for h, p in zip(hosts, ports, strict=False)
    )
    return f"PostgreSQL at {servers}/{info.get('dbname') or ''}"


class _Unfound:
    """What a look after a cut try found when it found nothing written."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NOT_WRITTEN = _Unfound("NOT_WRITTEN")  # the try's session is over, and it wrote nothing
UNKNOWN = _Unfound("UNKNOWN")  # the server did not tell in time


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
        connect: Callable[[float], Awaitable[ops.Conn]] | None = None,
    ) -> None:
        self.pool = pool
        # a new connection outside the pool, within a timeout (``answering`` asks on it)
        self.connect = connect
        self.where = where
        self.channel = channel
        self.sender = sender
        self.events = events
        self.notes = notes
        self.last_answer = float("-inf")  # when the server last finished a piece of work
        self.last_failure = float("-inf")  # when a connection last failed to do one
        self._probe: asyncio.Future[bool] | None = None  # a question asked outside the pool
        self._probe_began = float("-inf")
        self._probe_failed = float("-inf")
        self._took: deque[float] = deque(maxlen=_TRIES_KEPT)  # the latest tries that succeeded
        self._tries = Tries()
        self._looks = asyncio.Semaphore(LOOKS_AT_ONCE)  # (each on a connection of its own)
        self._sweeper: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Future[bool]] = set()  # sessions of cut tries being ended
        self._reading_back: set[asyncio.Task[None]] = set()  # aborts whose callers went away

    async def close(self) -> None:
        await cancel_and_wait(self._sweeper)
        for ending in list(self._ending):
            ending.cancel()
        for reading in list(self._reading_back):
            reading.cancel()
        # (a worker stuck opening a connection to a silent server is not waited for: the pool's
        # default held every close 5 s there; its connection attempt ends by its own timeout)
        await self.pool.close(timeout=POOL_CLOSE_S)

    async def ping(self, timeout: float) -> None:
        """``Store.ping``: a trivial question on a connection of the pool or, while every one is
        in use (long transactions of the application), on a new one of its own."""
        end = time.monotonic() + timeout
        try:
            conn = await self.pool.getconn(timeout=timeout / 2)  # the rest: to ask alone
        except PoolTimeout as exc:
            left = end - time.monotonic()
            if self._exhausted() and left > 0 and await self._ask(left):
                return  # the server answers; this process's connections are all busy
            raise StoreUnavailable(f"{self.where} is unreachable: {first_line(exc)}") from None

        async def ask() -> dict[str, Any] | None:
            cursor = await conn.execute(session.PING)
            return await cursor.fetchone()

        read_only = False
        try:
            # (a connection that does not answer is cut, not cancelled: psycopg's cancel waits
            # up to 10 s more for a server that may not answer it either)
            row = await within(conn, ask(), max(0.05, end - time.monotonic()))
            read_only = row is not None and row["read_only"] == "on"
        except Stalled:
            raise StoreUnavailable(f"{self.where} gave no answer within {timeout:g} s") from None
        except psycopg.Error as exc:
            # That connection is gone (the server restarted, an administrator ended its
            # session): the server itself may well answer a new one.
            left = end - time.monotonic()
            if left > 0.05 and await self._ask(left):
                return
            raise StoreUnavailable(f"{self.where} is unreachable: {first_line(exc)}") from None
        finally:
            if read_only:
                await conn.close()  # (replaced: the next may reach the writable server)
            await self.pool.putconn(conn)
        self.progressed()
        if read_only:
            raise StoreUnavailable(
                f"{self.where} answers but is read-only now (a standby, after a failover?);"
                " hearth cannot write there"
            )

    async def answering(self, timeout: float | None = None, *, until: float | None = None) -> bool:
        """Whether the server answers: it finished work lately, or it answers a question asked
        on a new connection of its own (outside the pool, whose connections may all be held
        by long transactions while the server is well). One question at a time, given
        ``PROBE_TIMEOUT_S`` whoever asked it (a slow link opens a connection slowly); this
        caller waits ``timeout`` for it (by default, what is left of ``patience`` since it was
        asked: a caller queued for the pool started it as it began to wait), a later one may
        find its answer; with ``until`` (a ``time.monotonic()``), no later than that. A failed one
        is not asked again for a moment."""
        now = time.monotonic()
        if self._answered_lately(now):
            return True
        asked = self._probe_began if self._probe is not None and not self._probe.done() else now
        probe = self._look(now)
        if probe is None:
            return False
        if timeout is None:  # (from the question asked first: one given up on counts too)
            timeout = self.patience() - (now - asked)
        if until is not None:  # (a caller that must be answered by then)
            timeout = min(timeout, until - now)
        try:
            async with asyncio.timeout(max(0.1, timeout)):
                return await asyncio.shield(probe)
        except Exception:  # (a TimeoutError among them: the question goes on being asked)
            return False

    def _look(self, now: float) -> asyncio.Future[bool] | None:
        """The question whether the server answers, asked now unless it is being asked; None
        if it failed a moment ago, or the pool is closed."""
        if now - self._probe_failed < ADMIT_WAIT_S / 3 or self.pool.closed:
            return None
        if self._probe is None or self._probe.done() or now - self._probe_began > self.patience():
            # (one unanswered past patience is left to end by itself: its connection may be
            # stranded, and a new one's answer is what the next caller needs)
            self._probe = asyncio.ensure_future(self._ask(PROBE_TIMEOUT_S))
            self._probe_began = now
        return self._probe

    def _round_trip(self) -> float:
        """About one round trip to the server: the fastest recent try."""
        return min(self._took, default=0.0)

    def patience(self) -> float:
        """How long the server may go without finishing anything before it is asked whether it
        answers, and take to show it does: an admission's budget, or on a slow link as long as
        opening a connection takes there (judged from the fastest recent try, about one round
        trip), up to ``PROBE_TIMEOUT_S``."""
        return min(PROBE_TIMEOUT_S, max(ADMIT_WAIT_S, LINK_ROUND_TRIPS * self._round_trip()))

    def _answered_lately(self, now: float) -> bool:
        # (not once a connection failed since: the start of an outage)
        return now - self.last_answer <= self.patience() and self.last_failure < self.last_answer

    async def _ask(self, timeout: float) -> bool:
        if self.connect is None:
            return False
        end = time.monotonic() + timeout
        try:
            async with asyncio.timeout(timeout):
                conn = await self.connect(timeout)
            async with conn:
                # (cut, not cancelled, at the end: a question stranded itself would wait
                # seconds more for psycopg's cancel request)
                question = self._tries.cut_stranded(conn, self.patience())
                await within(conn, question, max(0.1, end - time.monotonic()))
        except (TimeoutError, psycopg.Error, OSError):
            self._probe_failed = time.monotonic()
            return False
        self.progressed()
        return True

    async def read(self, work: Callable[[ops.Conn], Awaitable[T]]) -> T:
        async def run(conn: ops.Conn, _: ops.Outbox) -> T:
            return await work(conn)

        return await self._run(run, budget_s=READ_RETRY_S, transaction=False, try_s=READ_TRY_S)

    async def write(
        self,
        work: Work[T],
        *,
        budget_s: float,
        resolve: Resolve[T] | None = None,
        uncertain: bool = False,
        idle_is_lost: bool = True,
        try_s: float | None = None,
        overrun_is_final: bool = False,
        answer_by: float | None = None,
    ) -> T:
        """Run ``work`` in a transaction. ``uncertain``: an earlier try of the same write (a
        one-statement form of it) may have committed, so ``resolve`` looks first.
        ``idle_is_lost``: the server ending the transaction for idling (this process stopped
        inside it) is a lost connection, tried again; else a ``StoreError``. ``try_s``: how long
        one try may run (by default, what is left of the budget, up to ``WORK_TRY_S``).
        ``overrun_is_final``: a try that ran its whole time on a server that answers (the
        work's own doing: an application's long statement) is a ``StoreError``, not tried
        again. ``answer_by`` (a ``time.monotonic()``): when the caller should be answered (an
        admission's 2 s): its waits for the pool and for the server's answer to a probe end by
        then, and so does the look after a cut try; a try already sent keeps its time."""
        return await self._run(
            work,
            budget_s=budget_s,
            resolve=resolve,
            uncertain=uncertain,
            idle_is_lost=idle_is_lost,
            try_s=try_s,
            overrun_is_final=overrun_is_final,
            answer_by=answer_by,
        )

    async def write_once(
        self,
        work: Work[T],
        *,
        budget_s: float,
        resolve: Resolve[T],
        uncertain: bool = False,
        answer_by: float | None = None,
    ) -> T:
        """``write`` for work that is one round trip committing by itself (one statement, or
        statements in one simple query): no ``BEGIN`` and ``COMMIT`` of its own. ``uncertain``:
        it may have been written already (an answer was lost), so ``resolve`` looks first."""
        return await self._run(
            work,
            budget_s=budget_s,
            resolve=resolve,
            transaction=False,
            uncertain=uncertain,
            answer_by=answer_by,
        )

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float) -> AsyncIterator[ops.Conn]:
        """A connection of the pool for ``timeout`` seconds at most, as ``pool.connection``
        gives it; closed (so the pool replaces it) when it turns out to hold a stale plan."""
        async with self.pool.connection(timeout=timeout) as conn:
            async with replaced_when_unfit(conn):
                yield conn

    def committed(self, outbox: ops.Outbox, unsent: ops.Outbox | None = None) -> None:
        """After a commit: the pool has made progress, this process hears ``outbox`` now, and
        peers are notified of ``unsent`` (all of ``outbox`` unless its transaction notified
        some itself)."""
        self.progressed()
        self.events.publish_all(outbox)
        self.notes.add(outbox if unsent is None else unsent)

    def perhaps_committed(self, outbox: ops.Outbox) -> None:
        """The caller was cancelled while its try ran: the try may have committed all the same
        (a one-statement write answers as the server hears the cancel), and then nobody would
        hear of it until the next scan (an admission, a resolve waited 15 s). What it
        wrote is announced as hints, each read back by whoever hears it (a settled row too):
        a wake-up for a write that did not commit costs a read."""
        # Not an abort: heard, it interrupts the conversation's running work at once, and if the
        # stamp did not commit, that work goes on afterwards with its interrupted calls run
        # again. Its stamp is read back instead (its commit notified the peers).
        hints = [replace(e, attempt=0, row=None) for e in outbox if e.kind != ABORT]
        if hints:
            self.events.publish_all(hints)
            self.notes.add(hints)
        aborts = sorted({e.conversation_id for e in outbox if e.kind == ABORT})
        if aborts and not self.pool.closed:
            task = asyncio.create_task(
                self._read_back_aborts(aborts), context=contextvars.Context()
            )
            self._reading_back.add(task)
            task.add_done_callback(self._reading_back.discard)

    async def _read_back_aborts(self, conversation_ids: list[str]) -> None:
        """This process hears the aborts of ``conversation_ids`` that turn out stamped: its
        running work there stops now, not at its next heartbeat. (The cancelled try may still
        be ending on the server: it is looked for again a little later.)"""
        left = set(conversation_ids)
        for pause in ABORT_READ_BACK_S:
            await asyncio.sleep(pause)
            try:
                stamped = await self.read(partial(readback.aborting, conversation_ids=sorted(left)))
            except (HearthError, psycopg.Error):
                return  # (the heartbeat finds it)
            self.events.publish_all([Event(ABORT, c) for c in sorted(stamped)])
            left -= stamped
            if not left:
                return

    async def _run(
        self,
        work: Work[T],
        *,
        budget_s: float,
        transaction: bool = True,
        resolve: Resolve[T] | None = None,
        uncertain: bool = False,
        idle_is_lost: bool = True,
        try_s: float | None = None,
        overrun_is_final: bool = False,
        answer_by: float | None = None,
    ) -> T:
        start = time.monotonic()
        end, busy_end = start + budget_s, start + max(budget_s, POOL_BUSY_S)
        # By when a wait for a connection, or for the server to show it answers, must end, so
        # that a look after a cut still answers by ``answer_by`` (a try itself keeps its time:
        # cut short on a slow link, its statement still committed); not once the caller queued
        # for a pool a live server keeps busy (a burst is slow, not an outage).
        last = None if answer_by is None else answer_by - LOOK_AFTER_CUT_S
        delay, queued, stale, conflicts = 0.05, False, 0, 0
        # (an admission's own start, for what its answer says: before any group it waited in)
        asked = start if answer_by is None else min(start, answer_by - ANSWER_WINDOW_S)
        while True:
            outbox: ops.Outbox = []
            backend, limit = 0, 0.0  # the try's session on the server, and its time
            began = time.monotonic()
            try:
                wait = max(0.05, min(ADMIT_WAIT_S, end - time.monotonic()))
                if last is not None:
                    wait = min(wait, max(0.01, last - time.monotonic()))
                async with self._connection(wait, busy_end if queued else None) as conn:
                    # A connection nobody answers on any more (a dropped flow, a silent peer)
                    # is cut when the try's time is up, and the work goes on as after any lost
                    # connection: retried, a write read back first.
                    if try_s is not None:
                        limit = try_s
                    else:
                        # (one that queued for a busy pool has spent its budget there: its try
                        # gets a budget's time again, which a slow link's round trips need)
                        left = max(ADMIT_WAIT_S if queued else 0.05, end - time.monotonic())
                        # (at most a probe's time: the fastest of 20 tries may have been slow
                        # for reasons of its own, and an outage must still be answered soon)
                        left = max(left, min(PROBE_TIMEOUT_S, TRY_ROUND_TRIPS * self._round_trip()))
                        limit = min(left + TRY_GRACE_S, WORK_TRY_S)
                    began = time.monotonic()
                    backend = session.server_pid(conn)
                    sweeper = self._sweeper
                    if (sweeper is None or sweeper.done()) and not self.pool.closed:
                        # (in a context of its own: not the first caller's, for the store's life;
                        # again if one ended, as a stray cancellation would end it)
                        self._sweeper = asyncio.create_task(
                            self._sweep(), name="hearth-pg-sweep", context=contextvars.Context()
                        )
                    with self._tries.waiting(conn):
                        try:
                            resolved, result = await within(
                                conn,
                                self._try(conn, work, outbox, transaction, resolve, uncertain),
                                limit,
                            )
                        except asyncio.CancelledError:
                            self.perhaps_committed(outbox)
                            raise
                    self._took.append(time.monotonic() - began)
                if resolved:
                    return result
                if not transaction:
                    self.committed(outbox)
                else:
                    self.committed(outbox, [e for e in outbox if e.kind != ABORT])
                return result
            except (HearthError, psycopg.IntegrityError):
                # After a lost COMMIT whose transaction finished late, the retry is refused (the
                # fence moved on, the id exists): what was written is the answer.
                found = await self._resolve_late(resolve) if uncertain else None
                if found is None:
                    raise
                return found
            except PoolTimeout as exc:
                # Whether the server answers: on a fast link, asked no longer than the caller
                # may wait (a server that answers shows it in a moment; a frozen one kept an
                # admission 3.5 s); on a slow one, opening a connection takes what it takes.
                until = None
                if last is not None and not queued and self.patience() <= ADMIT_WAIT_S:
                    until = max(last, time.monotonic() + PROBE_AT_LEAST_S)
                answers = self._exhausted() and await self.answering(until=until)
                if answers and time.monotonic() < busy_end:
                    queued = True  # the server answers, every connection is in use: wait on
                    continue
                if time.monotonic() + delay >= end or self.pool.closed:
                    raise StoreUnavailable(self._why(exc, time.monotonic() - start)) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except psycopg.errors.ProgramLimitExceeded as exc:
                # An index key or a row over the server's limits (an OperationalError by its
                # class): the same work is refused again however often it is retried.
                raise StoreError(f"{self.where} refused the operation: {first_line(exc)}") from exc
            except psycopg.errors.TransactionRollback as exc:
                # A deadlock or a serialization failure: the server rolled this transaction
                # back (nothing of it committed) for a conflict with another; tried again at once.
                conflicts += 1
                if (
                    time.monotonic() >= end and conflicts > MAX_CONFLICT_RETRIES
                ) or self.pool.closed:
                    raise StoreUnavailable(
                        f"{self.where} is busy: the operation kept conflicting with others"
                        f" ({first_line(exc)})"
                    ) from None
                await asyncio.sleep(random.uniform(0, 0.05))
            except psycopg.OperationalError as exc:
                # Its COMMIT (a write's own, or the implicit one of a write in one round trip)
                # may have gone through.
                cut_at = time.monotonic()
                if transaction and isinstance(exc, Stalled) and backend:
                    # Cut at its limit, the server's side of it may still run, holding its
                    # locks (the lease renewals of every claim here wait for a submission's
                    # row): it is ended there. Found running a statement, it ran past its time
                    # by its own doing (an application's long statement): that is final.
                    # Otherwise (a lost link, a frozen server) it is a lost connection, and
                    # the session, if it is still there, is ended meanwhile.
                    if overrun_is_final and await self._end_backend(
                        backend, began, cut_at, running=True
                    ):
                        found = await self._resolve_late(resolve)
                        if found is not None:
                            return found
                        raise StoreError(
                            f"{self.where}: the transaction ran past its {limit:g} s and was"
                            " ended on the server; nothing of it committed"
                        ) from None
                    ending = asyncio.ensure_future(self._end_backend(backend, began, cut_at))
                    self._ending.add(ending)
                    ending.add_done_callback(self._ending.discard)
                self.failed()
                uncertain = uncertain or transaction or resolve is not None
                if time.monotonic() + delay >= end or self.pool.closed:
                    if isinstance(exc, Stalled) and backend and resolve is not None:
                        # Its caller hears 503 now: the cut try must not commit afterwards.
                        by = None if queued else answer_by
                        looked = await self.look_after_cut(backend, began, cut_at, resolve, end, by)
                        if not isinstance(looked, _Unfound):
                            return looked
                        if looked is NOT_WRITTEN:
                            raise StoreUnavailable(
                                f"{self.where} did not finish the operation within"
                                f" {time.monotonic() - asked:.1f} s (other work held what it"
                                " needed); it was stopped there and wrote nothing"
                            ) from None
                    raise StoreUnavailable(self._why(exc, time.monotonic() - asked)) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except psycopg.errors.IdleInTransactionSessionTimeout as exc:
                # The server ended the session: this process stood still inside the transaction
                # (a stop, a long pause) past the timeout hearth sets. Nothing of it committed.
                if not idle_is_lost:
                    raise StoreError(
                        f"{self.where} refused the operation: {first_line(exc)}"
                    ) from exc
                if time.monotonic() + delay >= end or self.pool.closed:
                    raise StoreUnavailable(self._why(exc, time.monotonic() - start)) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except psycopg.Error as exc:
                if stale_plan(exc) and stale < self.pool.max_size:
                    # That connection is gone now; another may hold the same stale plan. What
                    # is written in one round trip may have committed before the refusal.
                    stale += 1
                    uncertain = uncertain or (not transaction and resolve is not None)
                    continue
                raise StoreError(f"{self.where} refused the operation: {first_line(exc)}") from exc

    async def _end_backend(
        self, pid: int, began: float, cut_at: float, *, running: bool = False
    ) -> bool:
        """End the server's session ``pid`` (a try begun at ``began`` and cut at ``cut_at`` may
        still run there) if it is running a statement or, unless ``running``, in a
        transaction; whether it was."""
        if pid <= 0 or self.pool.closed:
            return False
        state = "state = 'active'" if running else "state <> 'idle'"
        try:
            async with self.pool.connection(timeout=END_BACKEND_S) as conn:
                ms = int(END_BACKEND_S * 1000)
                ending = _terminate(conn, pid, began, cut_at, state=state, ms=ms)
                return await within(conn, ending, 2 * END_BACKEND_S)
        except Exception as exc:
            log.debug("could not end the session %d: %s", pid, exc)
            return False

    async def session_over(self, pid: int, began: float, cut_at: float, until: float) -> bool:
        """Whether the server's session ``pid``, whose try (begun at ``began``, cut at
        ``cut_at``) may still run there, is over by ``until``: see ``_over``."""
        if pid <= 0:
            return False
        async with self._looking(until) as conn:
            return conn is not None and await self._over(conn, pid, began, cut_at, until)

    @contextlib.asynccontextmanager
    async def _looking(self, until: float) -> AsyncIterator[ops.Conn | None]:
        """A connection of its own for a look after a cut, opened by ``until`` (None if not):
        the pool's may all be held, a burst queued for them."""
        conn = None
        if self.connect is not None and not self.pool.closed:
            try:
                async with asyncio.timeout(max(0.01, until - time.monotonic())):
                    async with self._looks:
                        conn = await self.connect(max(0.05, until - time.monotonic()))
            except (TimeoutError, psycopg.Error, OSError) as exc:
                log.debug("could not open a connection to look after a cut: %s", exc)
        if conn is None:
            yield None
            return
        async with conn:
            yield conn

    async def _over(
        self, conn: ops.Conn, pid: int, began: float, cut_at: float, until: float
    ) -> bool:
        """On ``conn``: end the session ``pid`` if it still runs what the cut try sent or holds
        its transaction open (from version 14 on, waiting until it is gone); then whether it is
        over (gone, idle, or serving another client now). False if the server does not say by
        ``until``, or the session waits for a synchronous standby."""

        async def end() -> bool:
            left_ms = max(1, int(1000 * (until - time.monotonic())))
            await _terminate(conn, pid, began, cut_at, state="state <> 'idle'", ms=left_ms)
            cursor = await conn.execute(
                f"SELECT state, {_STILL_OURS} AS ours FROM pg_stat_activity WHERE pid = %(pid)s",
                {"pid": pid, "ago": _ago(began, cut_at)},
            )
            row = await cursor.fetchone()
            return row is None or row["state"] == "idle" or not row["ours"]

        try:
            return await within(conn, end(), max(0.05, until - time.monotonic()))
        except Exception as exc:
            log.debug("could not end the session %d: %s", pid, exc)
            return False

    async def look_after_cut(
        self,
        backend: int,
        began: float,
        cut_at: float,
        resolve: Resolve[T],
        end: float,
        answer_by: float | None = None,
    ) -> T | _Unfound:
        """What a write whose try was cut on ``backend`` wrote, found once that session is
        over; ``NOT_WRITTEN``, or ``UNKNOWN`` when the server does not tell in time. A try cut
        on a server that answers may still run there (waiting for a row another transaction
        holds: a fork's copy, say) and commit after its caller was told 503, who then sends it
        again: ended first, it cannot. The look ends by ``look_until``."""
        until = look_until(cut_at, end, answer_by)
        async with self._looking(until) as conn:
            if conn is None or not await self._over(conn, backend, began, cut_at, until):
                return UNKNOWN
            try:
                found = await within(conn, resolve(conn), max(0.05, until - time.monotonic()))
            except psycopg.Error:
                return UNKNOWN
        return NOT_WRITTEN if found is None else found

    async def _sweep(self) -> None:
        """While a try waits longer than ``patience``, ask the server whether its session has
        anything to do (``Tries.cut_stranded``): on a connection of the pool if one is free,
        else on one of its own, as ``answering`` asks (every connection stranded at once)."""
        while not self.pool.closed:
            await asyncio.sleep(_SWEEP_S)
            if not self._tries.longer_than(self.patience()):
                continue
            try:
                if self._exhausted():
                    await self.answering()
                    continue
                async with self.pool.connection(timeout=_SWEEP_S) as conn:
                    # (a connection the pool had idle may be stranded too: cut, it is replaced)
                    quiet = self.patience()
                    await within(conn, self._tries.cut_stranded(conn, quiet), quiet)
            except Exception as exc:  # (the next round looks again)
                log.debug("could not look for stranded connections: %s", exc)

    async def _try(
        self,
        conn: ops.Conn,
        work: Work[T],
        outbox: ops.Outbox,
        transaction: bool,
        resolve: Resolve[T] | None,
        uncertain: bool,
    ) -> tuple[bool, T]:
        """One try of ``_run``'s work on ``conn``: (True, what ``resolve`` found) when an earlier
        try turns out to have written it, else (False, the work's answer)."""
        if uncertain and resolve is not None:
            found = await resolve(conn)
            if found is not None:
                return True, found
        if not transaction:
            if resolve is not None:  # a write in one round trip, its own transaction
                _faults.reached("store:commit-begin")
            result = await work(conn, outbox)
            if resolve is not None:
                _faults.reached("store:commit-done")
            return False, result
        async with conn.transaction():
            result = await work(conn, outbox)
            urgent = [e for e in outbox if e.kind == ABORT]
            if urgent:
                await self._notify(conn, urgent)
            _faults.reached("store:commit-begin")  # the work ran; not committed yet
        _faults.reached("store:commit-done")  # committed; no caller has heard of it
        return False, result

    @contextlib.asynccontextmanager
    async def _connection(
        self, wait: float, patient_until: float | None
    ) -> AsyncIterator[ops.Conn]:
        """A connection of the pool, as ``pool.connection`` gives it; with ``patient_until``,
        waiting in the pool's queue for as long as the pool stays busy."""
        if patient_until is None:
            now = time.monotonic()
            if self._exhausted() and not self._answered_lately(now):
                # Asked while this caller queues, whether the server answers is known when
                # the wait ends: an admission that then asked gave up after twice its budget.
                self._look(now)
            conn = await self.pool.getconn(timeout=wait)
        else:
            conn = await self._wait_in_line(patient_until)
        try:
            async with replaced_when_unfit(conn), conn:
                yield conn
        finally:
            await self.pool.putconn(conn)

    async def _wait_in_line(self, until: float) -> ops.Conn:
        # One request keeps this caller's place in the pool's queue (asking again in short
        # turns would send it to the back each time, behind a burst that never ends); the
        # server is looked at meanwhile, so that an outage still ends the wait soon.
        getting = asyncio.ensure_future(
            self.pool.getconn(timeout=max(0.05, until - time.monotonic()))
        )
        try:
            while True:
                done, _ = await asyncio.wait({getting}, timeout=ADMIT_WAIT_S / 3)
                if done:
                    return getting.result()
                if not (self._exhausted() and await self.answering(PROBE_TIMEOUT_S)):
                    raise PoolTimeout(
                        "the server stopped answering while every connection was busy"
                    )
        except BaseException:
            getting.cancel()
            try:
                conn = await getting
            except BaseException:  # cancelled, or failed: no connection to give back
                pass
            else:
                await self.pool.putconn(conn)  # handed over just as the wait ended
            raise

    def progressed(self) -> None:
        """Note that the server just answered (a connection is not lost if work gets done)."""
        self.last_answer = time.monotonic()

    def failed(self) -> None:
        """Note that a connection just failed: the pool is not only busy, lately answered."""
        self.last_failure = time.monotonic()

    def _exhausted(self) -> bool:
        """Whether every connection of the pool is in use."""
        stats = self.pool.get_stats()
        return stats.get("pool_size", 0) > 0 and stats.get("pool_available", 0) == 0

    def _busy(self) -> bool:
        """Whether every connection of the pool is in use while the server goes on answering
        (a burst, long transactions), as opposed to connections stuck on a server that does not
        (an outage). ``answering`` asks the server when nothing finished lately."""
        return self._exhausted() and self._answered_lately(time.monotonic())

    def _why(self, exc: BaseException, waited: float) -> str:
        """Why a caller that tried for ``waited`` seconds is given up on."""
        if isinstance(exc, PoolTimeout) and self._busy():
            return (
                f"{self.where} is busy: every connection of the pool was in use for"
                f" {waited:.1f} s (raise HEARTH_PG_POOL, or send less at once)"
            )
        if isinstance(exc, ReadOnlyServer | psycopg.errors.DiskFull):
            # (it answers, and says why it cannot do the work: a full disk, a standby)
            return f"{self.where} cannot take writes now: {first_line(exc)}"
        # (the last try's own error says how long that try waited, not the caller)
        return f"{self.where} is unreachable (tried for {waited:.1f} s): {first_line(exc)}"

    async def _resolve_late(self, resolve: Resolve[T] | None) -> T | None:
        if resolve is None or self.pool.closed:
            return None
        try:
            async with self.pool.connection(timeout=ADMIT_WAIT_S) as conn:
                return await within(conn, resolve(conn), READ_TRY_S)
        except (psycopg.Error, PoolTimeout):
            return None

    async def announce(self, events: ops.Outbox) -> None:
        """Tell this process and its peers of ``events`` that no commit carries (what a caller
        wants done before it can write: the owner of a locked row stopping its work)."""
        self.events.publish_all(events)
        with contextlib.suppress(psycopg.Error, PoolTimeout):
            async with self.pool.connection(timeout=ADMIT_WAIT_S) as conn:
                await within(conn, self._notify(conn, events), ADMIT_WAIT_S)

    async def _notify(self, conn: ops.Conn, outbox: ops.Outbox) -> None:
        await conn.execute(
            "SELECT pg_notify(%(ch)s, p) FROM unnest(%(ps)b::text[]) AS p",
            {"ch": self.channel, "ps": encode_all(outbox, self.sender)},
        )


async def _terminate(
    conn: ops.Conn, pid: int, began: float, cut_at: float, *, state: str, ms: int
) -> bool:
    """End, on ``conn``, the session ``pid`` in ``state`` if it still runs what a try begun at
    ``began`` and cut at ``cut_at`` sent (``_TERMINATE``); from version 14 on, waiting up to
    ``ms`` for it to be gone, its locks freed. Whether it was ended."""
    wait = ", %(ms)s" if conn.info.server_version >= 140000 else ""
    params = {"pid": pid, "ms": ms, "ago": _ago(began, cut_at)}
    cursor = await conn.execute(_TERMINATE.format(wait=wait, state=state), params)
    row = await cursor.fetchone()
    return bool(row and row["ended"])


def answer_by(until: float) -> float:
    """When an admission whose budget ends at ``until`` is answered at the latest (the HTTP
    answer within 2 s): its try's grace, then a look at what a cut try wrote."""
    return until + TRY_GRACE_S + LOOK_AFTER_CUT_S


def look_until(cut_at: float, end: float, answer_by: float | None) -> float:
    """By when the look after a try cut at ``cut_at`` ends: ``LOOK_AFTER_CUT_S`` past the
    budget ending at ``end`` and its grace (or past the cut, if later), and no later than
    ``answer_by`` (unless that leaves it nothing)."""
    until = max(end + TRY_GRACE_S, cut_at) + LOOK_AFTER_CUT_S
    if answer_by is not None:
        until = min(until, max(answer_by, cut_at + 0.05))
    return until


def _ago(began: float, cut_at: float) -> float:
    """How many seconds ago (now) a transaction of a try begun at ``began`` and cut at
    ``cut_at`` began at the latest, as the server would see it: halfway through the try (its
    first statement reached the server after ``began``; a client the pooler served after the
    cut began after ``cut_at``)."""
    return max(0.0, time.monotonic() - cut_at + (cut_at - began) / 2)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
