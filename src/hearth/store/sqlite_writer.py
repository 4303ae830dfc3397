"""One connection, group commit, and a thread that runs the groups when the disk is slow.

Every operation — reads included — is a closure run on the only connection. The operations that
the event loop asks for in one of its iterations are collected and run together at the end of
it, in one transaction (each write in its own savepoint when one of them fails, so a failing
operation undoes only itself) with one commit: concurrent appends share one fsync.

Where they run: on the event loop itself, when the thread is idle, nothing of this loop's is in
its queue and the last commit was fast (under ``SLOW_COMMIT_S``). That spares each operation
two thread switches and each group the contention of two threads for the GIL: a lone step then
costs one commit (``bench/handoff.py``), and 64 stepping at once are bound by their CPU, not by
the hand-off. An operation asked for when nothing else of the loop is due in its iteration
runs at once, as a group of its own (nothing could have joined it), and its caller is answered
without a turn of the loop (one such answer yields to the loop every ``YIELD_EVERY_S``, so that
a caller writing in a loop lets the loop look for I/O and timers). When a commit is slow, the
next groups go to the writer thread, so that the loop keeps working while the disk syncs; the
first fast commit brings them back. Either way a caller is answered only after the commit, so
it never sees data that could still be lost. (The price: while a group commits on the loop,
the loop waits for its fsync, so a disk that stalls stalls the loop for one commit before the
thread takes over.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hearth import _faults
from hearth._tasks import run_to_end
from hearth.errors import StoreError, StoreUnavailable
from hearth.store.events import Event, StoreEvents

MAX_GROUP = 1024  # bounds how long one group holds the futures it has already run
# A commit slower than this sends the next groups to the thread (a disk that syncs slowly, or a
# WAL checkpoint): while the thread waits for the disk, the loop goes on.
SLOW_COMMIT_S = 0.001
# Operations run at once (nothing else of the loop due) return without a turn of the loop, but
# one of them at least this often yields to it: a caller that writes in a loop delays the I/O
# and the timers of the others by this much at most.
YIELD_EVERY_S = 0.001

log = logging.getLogger("hearth.store")

T = TypeVar("T")
Outbox = list[Event]  # what an operation changed, published only after its commit
Work = Callable[[sqlite3.Connection, Outbox], T]


def _identity(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


class FileWatch:
    """The files a connection opened: the database and its WAL, known by device and inode.

    SQLite goes on writing to a file it opened after the file lost its name: a database file
    deleted or replaced while this process serves would take every later commit with it (and a
    second process could open the path), a WAL deleted would take what it holds not yet copied
    into the database. ``database_gone`` and ``wal_gone`` compare the names with what was
    opened."""

    # How often a write looks: a ``stat`` of the WAL just after its sync costs a step 50 µs
    # (ext4), more than the rest of hearth's own work on it. A file deleted is noticed within
    # this time; the writes committed meanwhile went where the deleted file was.
    EVERY_S = 0.1

    def __init__(self, path: str) -> None:
        self.path = path
        self.db = _identity(path)
        self.wal = _identity(path + "-wal")
        self._looked = time.monotonic()

    def due(self) -> bool:
        """Whether a write should look now (at most once every ``EVERY_S``)."""
        now = time.monotonic()
        if now - self._looked < self.EVERY_S:
            return False
        self._looked = now
        return True

    def database_gone(self) -> str | None:
        """Why the database file is not the one opened any more; None while it is."""
        if self.db is None or _identity(self.path) == self.db:
            return None
        return (
            f"the database file {self.path} was deleted or replaced while this process had it"
            " open: nothing more is written (a new process could open another file there);"
            " restart hearth on the file it should use"
        )

    def wal_gone(self) -> bool:
        """Whether the WAL opened lost its name (a WAL made since is taken as the one opened)."""
        now = _identity(self.path + "-wal")
        if self.wal is None:
            self.wal = now
            return False
        return now != self.wal

    def renew(self) -> None:
        self.wal = _identity(self.path + "-wal")


@dataclass(eq=False)
class _Op:
    work: Work[Any]
    write: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    outbox: Outbox = field(default_factory=list)
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class _Stop:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


class GroupCommitWriter:
    """Runs closures on one connection, committing each group of them once: on the event loop
    that asked for them when the thread is idle and commits are fast, else on the writer thread.

    ``commits``, ``ops`` and ``submitted`` count committed transactions, executed operations and
    queued ones, ``inline`` the groups run on the loop and ``alone`` the operations of those run
    at once, so the effect of group commit can be observed.
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        events: StoreEvents,
        watch: Callable[[], FileWatch | None] = lambda: None,
    ) -> None:
        self._connect = connect
        self._new_watch = watch  # made after each connection opens
        self._watch: FileWatch | None = None
        self.events = events
        self.commits = 0
        self.ops = 0
        self.submitted = 0
        self.inline = 0  # groups run on the event loop instead of the thread
        self.alone = 0  # of those, operations run at once, nothing else being due
        self._yielded = 0.0  # when one of those last yielded to the loop (monotonic)
        self._slow = False  # the last commit took longer than SLOW_COMMIT_S
        self._queue: queue.SimpleQueue[_Op | _Stop] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._running = threading.Lock()  # held by whichever thread runs a group
        self._home: asyncio.AbstractEventLoop | None = None  # the loop that started the writer
        self._collected: list[_Op] = []  # the home loop's operations of this iteration
        self._handed = 0  # the home loop's operations handed to the thread, not yet delivered
        self._closing = False
        self._gate = threading.Event()
        self._gate.set()

    @property
    def running(self) -> bool:
        return self._thread is not None

    async def start(self) -> None:
        """Start the thread and open the connection; raises what opening raised."""
        if self._thread is not None:
            return
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._closing = False
        self._home, self._handed = loop, 0
        self._thread = threading.Thread(
            target=self._main, args=(loop, ready), name="hearth-sqlite-writer", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.shield(ready)
        except asyncio.CancelledError:
            # The caller gave up while the file was being opened: the thread still opens it,
            # then would serve nobody, the file locked, and a join here would block the loop.
            # (To its end: an anyio scope cancels again at every await, a person presses
            # Ctrl-C twice.)
            await run_to_end(self._abandon(ready))
            raise
        except BaseException:
            self._thread.join()  # (it failed to open and ends now)
            self._thread = None
            raise

    async def _abandon(self, ready: asyncio.Future[None]) -> None:
        """Close what a start given up on opened, once it has (the file is free again)."""
        try:
            await ready
        except BaseException:
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            return
        await self.stop()

    async def stop(self) -> None:
        """Finish the queued work, stop the thread and close the connection. Idempotent."""
        thread = self._thread
        if thread is not None and not thread.is_alive():
            self._thread = thread = None  # the writer died; nothing is left to stop
        if thread is None or self._closing:
            return
        self._closing = True
        self._hand_over()  # what was asked for before the stop runs before it
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._gate.set()
        self._queue.put(_Stop(loop, done))
        await done
        # Answering the stop is the thread's last act: the join is immediate. (Waited for on an
        # executor's thread, it waited behind the application's calls filling that executor.)
        thread.join()
        self._thread = None

    def pause(self) -> None:
        """Test hook: the thread takes no new group until ``resume``."""
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    async def call(self, work: Work[T], *, write: bool, inline: bool = True) -> T:
        """Run ``work`` on the connection. ``inline=False``: never on the event loop (a read
        of a whole long stream would hold the loop, and every request, while it decodes)."""
        if self._thread is None or self._closing:
            raise StoreError("the SQLite store is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.submitted += 1
        op = _Op(work, write, loop, future)
        if loop is self._home and not inline:
            self._hand_over()  # what this loop asked for before runs before it
            self._handed += 1
            self._queue.put(op)
        elif loop is self._home:
            if not self._collected and _nothing_else_ready(loop) and self._run_alone(op):
                now = time.monotonic()
                if now - self._yielded >= YIELD_EVERY_S:
                    # A caller that writes in a loop lets the loop look for I/O and timers
                    # (one whose writes fail and who tries again too: it froze the process).
                    self._yielded = now
                    try:
                        await asyncio.sleep(0)
                    except BaseException:
                        future.exception()  # (cancelled: its operation's error goes too)
                        raise
                return future.result()  # (its error is raised here)
            if not self._collected:
                loop.call_soon(self._dispatch)
            self._collected.append(op)
        else:
            self._queue.put(op)
        return await future

    def _dispatch(self) -> None:
        """At the end of a loop iteration: run what it collected here when the thread is idle,
        nothing of this loop's is queued and the disk is fast; else hand it to the thread."""
        if (
            not self._slow
            and self._handed == 0
            and len(self._collected) <= MAX_GROUP
            and self._gate.is_set()
        ):
            if self._running.acquire(blocking=False):
                try:
                    ran = self._run_here()
                finally:
                    self._running.release()
                if ran is not None:
                    self._deliver(ran)  # outside the lock: the thread may take its next group
                    return
        self._hand_over()

    def _run_alone(self, op: _Op) -> bool:
        """Run ``op`` now, as a group of its own, on the terms of ``_dispatch``; False (nothing
        run) when they do not hold."""
        if self._slow or self._handed or not self._gate.is_set():
            return False
        if not self._running.acquire(blocking=False):
            return False
        try:
            self._collected = [op]
            ran = self._run_here()
        finally:
            self._running.release()
        if ran is None:
            self._collected = []
            return False
        self.alone += 1
        self._deliver(ran)
        return True

    def _run_here(self) -> list[_Op] | None:
        """Run what was collected on this thread (the lock held); None when the store closed."""
        conn = self._conn
        if conn is None or self._closing:
            return None
        group, self._collected = self._collected, []
        self._run_group(conn, group)
        self.inline += 1
        self.ops += len(group)
        return group

    def _hand_over(self) -> None:
        group, self._collected = self._collected, []
        self._handed += len(group)
        for op in group:
            self._queue.put(op)

    def _main(self, loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None]) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:
            _post(loop, _fail, ready, exc)
            return
        self._conn = conn
        self._watch = self._new_watch()
        _post(loop, _succeed, ready, None)
        stop: _Stop | None = None
        try:
            stop = self._serve()
        finally:
            self._closing = True
            with self._running:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
            while True:  # anything queued behind the stop is refused, never left hanging
                try:
                    late = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(late, _Op):
                    late.error = StoreError("the SQLite store was closed")
                    _post(late.loop, self._deliver_handed, [late])
            if stop is not None:
                _post(stop.loop, _succeed, stop.future, None)

    def _serve(self) -> _Stop:
        while True:
            first = self._queue.get()
            self._gate.wait()
            if isinstance(first, _Stop):
                return first
            group, stop = [first], None
            while len(group) < MAX_GROUP:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Stop):
                    stop = item
                    break
                group.append(item)
            with self._running:
                conn = self._reopened()
                if conn is None:
                    for op in group:
                        op.error = StoreUnavailable("the SQLite file cannot be opened again")
                else:
                    self._run_group(conn, group)
            self._finish(group)
            if stop is not None:
                return stop

    def _reopened(self) -> sqlite3.Connection | None:
        """The connection; a new one if a reopening (``_watched``) failed, None if this fails."""
        if self._conn is None:
            try:
                self._conn = self._connect()
            except Exception:
                log.exception("hearth: the SQLite file cannot be opened again")
                return None
            self._watch = self._new_watch()
        return self._conn

    def database_gone(self) -> str | None:
        """Why the database file is not the one this writer opened; None while it is."""
        return None if self._watch is None else self._watch.database_gone()

    def _watched(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """``conn``, or a new connection when the WAL lost its name (what it held is copied
        into the database first); ``_FileGone`` when the database file did."""
        watch = self._watch
        if watch is None or not watch.due():
            return conn
        gone = watch.database_gone()
        if gone is not None:
            raise _FileGone(gone)
        if not watch.wal_gone():
            return conn
        # SQLite reads the WAL through what it opened: a checkpoint still copies it whole.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        self._conn = None
        self._conn = conn = self._connect()
        watch.renew()
        log.warning(
            "hearth: the WAL of %s was deleted while this process had it open; what it held"
            " was copied into the database and a new WAL begun",
            watch.path,
        )
        return conn

    def _run_group(self, conn: sqlite3.Connection, group: list[_Op]) -> None:
        writes = any(op.write for op in group)
        if writes:
            try:
                conn = self._watched(conn)
            except (_FileGone, sqlite3.Error, StoreError) as exc:
                for op in group:
                    op.error = StoreUnavailable(str(exc))
                    op.outbox.clear()
                return
        # A lone write needs no savepoint: if it fails, rolling back the transaction is the same.
        # Several are first run together without savepoints (two statements fewer each); if one
        # fails, that try is rolled back and the group runs again, each write in its savepoint.
        savepoints = writes and len(group) > 1
        if savepoints and self._run_plain(conn, group):
            return
        try:
            if writes:
                conn.execute("BEGIN IMMEDIATE")
            for op in group:
                if op.write and savepoints:
                    conn.execute("SAVEPOINT op")
                try:
                    op.result = op.work(conn, op.outbox)
                except Exception as exc:
                    op.error = _as_store_error(exc)
                    op.outbox.clear()
                    if op.write and savepoints:
                        conn.execute("ROLLBACK TO op")  # a failure here fails the whole group
                    elif op.write:
                        conn.execute("ROLLBACK")
                        writes = False
                if op.write and savepoints:
                    conn.execute("RELEASE op")
            if writes:
                self._commit(conn)
        except sqlite3.Error as exc:
            _fail_all(conn, group, exc)

    def _run_plain(self, conn: sqlite3.Connection, group: list[_Op]) -> bool:
        """Run and commit ``group`` in one transaction without savepoints; False, with nothing
        written and every op as it was, when any op failed (or the transaction did)."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op in group:
                op.result = op.work(conn, op.outbox)
        except Exception:
            for op in group:
                op.result = None
                op.outbox.clear()
            _rollback(conn)
            return False
        try:
            self._commit(conn)
        except sqlite3.Error as exc:
            _fail_all(conn, group, exc)  # answered: every op failed with the commit
        return True

    def _commit(self, conn: sqlite3.Connection) -> None:
        _faults.reached("store:commit-begin")  # the group ran; nothing is committed yet
        t0 = time.perf_counter()
        conn.execute("COMMIT")
        self._slow = time.perf_counter() - t0 > SLOW_COMMIT_S
        self.commits += 1
        _faults.reached("store:commit-done")  # committed; no caller has heard of it

    def _finish(self, group: list[_Op]) -> None:
        self.ops += len(group)
        by_loop: dict[asyncio.AbstractEventLoop, list[_Op]] = {}
        for op in group:
            by_loop.setdefault(op.loop, []).append(op)
        for loop, ops in by_loop.items():
            _post(loop, self._deliver_handed, ops)

    def _deliver_handed(self, ops: list[_Op]) -> None:
        if ops[0].loop is self._home:
            self._handed -= len(ops)
        self._deliver(ops)

    def _deliver(self, ops: list[_Op]) -> None:
        committed: Outbox = []
        for op in ops:
            committed += op.outbox
            if op.future.done():  # the caller was cancelled; the work stands anyway
                continue
            if op.error is not None:
                op.future.set_exception(op.error)
            else:
                op.future.set_result(op.result)
        self.events.publish_all(committed)


class _FileGone(Exception):
    """The database file is not the one the connection opened."""


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _fail_all(conn: sqlite3.Connection, group: list[_Op], exc: sqlite3.Error) -> None:
    """The group's transaction failed: roll back what is left of it; every op fails."""
    _rollback(conn)
    for op in group:
        op.error = _failure(exc, "the SQLite transaction failed and was rolled back")
        op.outbox.clear()


def _as_store_error(exc: Exception) -> Exception:
    if isinstance(exc, sqlite3.Error):
        return _failure(exc, "SQLite error")
    return exc


def _failure(exc: sqlite3.Error, what: str) -> StoreError:
    """A full disk or a failed write is a pause, not a bug: ``StoreUnavailable`` (HTTP 503)
    saying what to do; the transaction was rolled back, so nothing half-written remains."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code == sqlite3.SQLITE_FULL or "disk is full" in str(exc):
        return StoreUnavailable(f"{what}: the disk is full; free space and hearth goes on")
    if code is not None and code & 0xFF == sqlite3.SQLITE_IOERR:
        return StoreUnavailable(
            f"{what}: the disk refused a write ({exc}: a full disk, a file size limit or a"
            " failing device); hearth goes on once writes succeed again"
        )
    return StoreError(f"{what}: {exc}")


def _nothing_else_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether no other callback of ``loop`` is due in this iteration, so that nothing else can
    join a group begun now. Only asyncio's own loop tells (its ``_ready`` queue); for another
    (uvloop) this answers False, and every operation waits for the end of the iteration."""
    ready = getattr(loop, "_ready", None)
    return ready is not None and not ready


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _succeed(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
