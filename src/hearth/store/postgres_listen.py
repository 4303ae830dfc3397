"""Push across processes: one ``LISTEN`` connection per store, fed into its ``StoreEvents``.

A notification is sent only once the change it names has committed: ``Notes`` sends it right
after the commit (an abort intent goes inside its transaction). Payloads carry ids and offsets
only. The listener reconnects by itself with backoff; while it is down the coordinator's
polling at ``scan_s`` keeps work moving, so a lost notification delays work but never loses it.
A listener that has heard nothing for a while asks its connection a ``SELECT 1``: a connection
whose peer went silent without closing it (a dropped flow) would otherwise listen for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from hearth._tasks import cancel_and_wait
from hearth.store.events import APPENDED, KINDS, Event, StoreEvents
from hearth.store.postgres_deadline import CUT_WAIT_S, cut, within

log = logging.getLogger("hearth.store.postgres")

_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 2.0
_SEND_TRY_S = 2.0  # one statement: a live server answers it in milliseconds
# Heard nothing for this long, the listener checks its connection, which must answer in
# _CHECK_S: a silent peer (its flow dropped, keepalives answered by a middlebox) fails no read.
_QUIET_S = 5.0
_CHECK_S = 3.0


_compact = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per call


# PostgreSQL refuses a payload of 8000 bytes or more; events are packed into payloads below this.
PAYLOAD_LIMIT = 7900


def encode_all(events: list[Event], sender: str) -> list[str]:
    """Payloads carrying ``events`` in order, as many to a payload as fit under
    ``PAYLOAD_LIMIT``: ``[sender, kind, conversation, offset, submission, kind, ...]``, the
    sender once and four fields per event (one event's payload reads as it did before events
    were packed). One notification for many events is one entry in the server's queue and one
    message to each listener, not one per event."""
    head = own_prefix(sender)  # '["sender",': ASCII, as the encoder escapes the rest
    payloads: list[str] = []
    parts: list[str] = []
    size = len(head) + 1  # and the closing bracket
    for event in events:
        fields = [event.kind, event.conversation_id, event.offset, event.submission_id]
        part = _compact(fields)[1:-1]
        if parts and size + 1 + len(part) > PAYLOAD_LIMIT:
            payloads.append(head + ",".join(parts) + "]")
            parts, size = [], len(head) + 1
        size += len(part) + bool(parts)  # a comma before all but the first
        parts.append(part)
    if parts:
        payloads.append(head + ",".join(parts) + "]")
    return payloads


def own_prefix(sender: str) -> str:
    """How every payload that ``sender`` encodes starts: a store's listener hears its own
    notifications too, and drops them by this prefix without decoding them."""
    return _compact([sender])[:-1] + ","


def decode(payload: str) -> tuple[str, list[Event]] | None:
    """The sender and the events of a payload that ``encode_all`` wrote; None for anything
    else (nothing of a payload is taken unless all of it is well formed)."""
    try:
        fields = json.loads(payload)
        if not isinstance(fields, list) or len(fields) < 5 or (len(fields) - 1) % 4:
            return None
        events = []
        for at in range(1, len(fields), 4):
            kind, conversation_id, offset, submission_id = fields[at : at + 4]
            if kind not in KINDS or not isinstance(conversation_id, str):
                return None
            events.append(Event(kind, conversation_id, int(offset), submission_id))
    except (ValueError, TypeError):
        return None
    return str(fields[0]), events


class Listener:
    """Listens on ``channel`` and publishes what other stores committed into ``events``.

    ``connected`` is set while the ``LISTEN`` is in place; ``on_reconnect`` is called after a
    reconnection, when notifications may have been missed.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        channel: str,
        sender: str,
        events: StoreEvents,
        on_reconnect: Callable[[], None],
    ) -> None:
        self._connect = connect  # a new connection in autocommit, with hearth's settings
        self._channel = channel
        self._own = own_prefix(sender)
        self._events = events
        self._on_reconnect = on_reconnect
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None  # the one listening now
        self._stopping = False
        self.connected = asyncio.Event()
        self.backend_pid: int | None = None

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name="hearth-pg-listener")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and self._conn is not None:
            # Its connection cut, the listener ends by itself. Cancelled while it waited on
            # the connection, psycopg would ask the server to cancel the statement, on a new
            # connection: a server that stopped answering held a store's close 10 s.
            self._stopping = True
            cut(self._conn)
            await asyncio.wait({task}, timeout=CUT_WAIT_S)
        await cancel_and_wait(task)

    async def _run(self) -> None:
        delay, first = _BACKOFF_MIN_S, True
        while True:
            try:
                conn = await self._connect()
            except psycopg.Error as exc:
                log.warning("the notification listener cannot connect (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
                continue
            self._conn = conn
            try:
                listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
                await within(conn, conn.execute(listen), _CHECK_S)
                self.backend_pid = conn.info.backend_pid
                self.connected.set()
                if not first:
                    self._on_reconnect()  # what was missed meanwhile is found by a look
                first, delay = False, _BACKOFF_MIN_S
                await self._listen(conn)
            except psycopg.Error as exc:
                if self._stopping:
                    return  # (its connection was cut by ``stop``)
                log.warning("the notification listener lost its connection (%s); reconnecting", exc)
            finally:
                self.connected.clear()
                self._conn = None
                with contextlib.suppress(Exception):
                    await conn.close()
            await asyncio.sleep(delay)
            # (A LISTEN the server refuses, as a standby does, is tried ever less often.)
            delay = min(delay * 2, _BACKOFF_MAX_S)

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Deliver what ``conn`` hears until it fails, or stops answering: a quiet connection
        is asked a ``SELECT 1`` every ``_QUIET_S``, and cut if no answer comes within
        ``_CHECK_S`` (a notification arriving meanwhile waits in psycopg's backlog)."""
        heard = time.monotonic()  # the connection's last sign of life
        while True:
            async for note in conn.notifies(timeout=_QUIET_S):
                heard = time.monotonic()
                self._deliver(note.payload)
            if time.monotonic() - heard >= _QUIET_S:
                await within(conn, conn.execute("SELECT 1"), _CHECK_S)
                heard = time.monotonic()

    def _deliver(self, payload: str) -> None:
        if payload.startswith(self._own):
            return  # this store published its own events after its commits
        decoded = decode(payload)
        if decoded is None:
            log.warning("ignoring a malformed notification: %.200s", payload)
            return
        for event in decoded[1]:  # a peer's: this store's own were dropped above
            self._events.publish(event)


class Notes:
    """Notifications sent after the commits they announce, several in one statement.

    A transaction that notifies holds the server's notification-queue lock from just before its
    commit until just after it, so no two notifying commits (and their WAL flushes) overlap:
    64 tool calls stepping at once would commit one by one. So writes commit without notifying
    and ``add`` their events here; one statement of notifications alone (no WAL to flush) sends
    what gathered meanwhile, ``appended`` coalesced to each conversation's newest offset. A
    process that dies between a commit and its notification loses the notification; like any lost
    event, that delays a peer's waiter until its own re-read or scan, but never misleads it.
    (Abort intents, rare and awaited by a running owner, are still notified in their
    transaction.)
    """

    def __init__(self, pool: AsyncConnectionPool[Any], channel: str, sender: str) -> None:
        self.pool = pool
        self.channel = channel
        self.sender = sender
        self._appended: dict[str, int] = {}
        self._others: list[Event] = []
        self._task: asyncio.Task[None] | None = None

    def add(self, events: list[Event]) -> None:
        for event in events:
            if event.kind != APPENDED:
                self._others.append(event)
            elif event.offset > self._appended.get(event.conversation_id, -1):
                self._appended[event.conversation_id] = event.offset
        if events and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._send(), name="hearth-notes")

    async def close(self, timeout: float) -> None:
        """Send what is pending (within ``timeout``)."""
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=timeout)

    async def _send(self) -> None:
        while self._appended or self._others:
            events = self._others + [Event(APPENDED, c, last) for c, last in self._appended.items()]
            self._appended, self._others = {}, []
            try:
                async with self.pool.connection(timeout=2.0) as conn:
                    # (bounded: a send stuck on a dead connection would hold back every later one)
                    await within(
                        conn,
                        conn.execute(
                            "SELECT pg_notify(%(ch)s, p) FROM unnest(%(ps)b::text[]) AS p",
                            {"ch": self.channel, "ps": encode_all(events, self.sender)},
                        ),
                        _SEND_TRY_S,
                    )
            except (psycopg.Error, PoolTimeout) as exc:
                log.debug("notifications not sent (peers re-read instead): %s", exc)
                return
