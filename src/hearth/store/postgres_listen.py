"""Push across processes: one ``LISTEN`` connection per store, fed into its ``StoreEvents``.

A notification is sent only once the change it names has committed: ``Notes`` sends it right
after the commit (an abort intent goes inside its transaction). Payloads carry ids and offsets
only. The listener reconnects by itself with backoff; while it is down the coordinator's
polling at ``scan_s`` keeps work moving, so a lost notification delays work but never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from hearth._tasks import cancel_and_wait
from hearth.store.events import APPENDED, KINDS, Event, StoreEvents

log = logging.getLogger("hearth.store.postgres")

_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 2.0


_compact = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per call


def encode(event: Event, sender: str) -> str:
    """The notification payload of one event (well under PostgreSQL's 8000-byte limit)."""
    return _compact([sender, event.kind, event.conversation_id, event.offset, event.submission_id])


def own_prefix(sender: str) -> str:
    """How every payload that ``sender`` encodes starts: a store's listener hears its own
    notifications too, and drops them by this prefix without decoding them."""
    return _compact([sender])[:-1] + ","


def decode(payload: str) -> tuple[str, Event] | None:
    try:
        sender, kind, conversation_id, offset, submission_id = json.loads(payload)
    except (ValueError, TypeError):
        return None
    if kind not in KINDS or not isinstance(conversation_id, str):
        return None
    return str(sender), Event(kind, conversation_id, int(offset), submission_id)


class Listener:
    """Listens on ``channel`` and publishes what other stores committed into ``events``.

    ``connected`` is set while the ``LISTEN`` is in place; ``on_reconnect`` is called after a
    reconnection, when notifications may have been missed.
    """

    def __init__(
        self,
        conninfo: str,
        connect_kwargs: dict[str, Any],
        channel: str,
        sender: str,
        events: StoreEvents,
        on_reconnect: Callable[[], None],
    ) -> None:
        self._conninfo = conninfo
        self._kwargs = connect_kwargs
        self._channel = channel
        self._sender = sender
        self._own = own_prefix(sender)
        self._events = events
        self._on_reconnect = on_reconnect
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.backend_pid: int | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="hearth-pg-listener")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        delay, first = _BACKOFF_MIN_S, True
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, **self._kwargs
                )
            except psycopg.Error as exc:
                log.warning("the notification listener cannot connect (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
                continue
            try:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                self.backend_pid = conn.info.backend_pid
                self.connected.set()
                if not first:
                    self._on_reconnect()  # what was missed meanwhile is found by a look
                first, delay = False, _BACKOFF_MIN_S
                async for note in conn.notifies():
                    self._deliver(note.payload)
            except psycopg.Error as exc:
                log.warning("the notification listener lost its connection (%s); reconnecting", exc)
            finally:
                self.connected.clear()
                with contextlib.suppress(Exception):
                    await conn.close()
            await asyncio.sleep(delay)

    def _deliver(self, payload: str) -> None:
        if payload.startswith(self._own):
            return  # this store published its own events after its commits
        decoded = decode(payload)
        if decoded is None:
            log.warning("ignoring a malformed notification: %.200s", payload)
            return
        sender, event = decoded
        if sender != self._sender:  # this store published its own events after its commits
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
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def _send(self) -> None:
        while self._appended or self._others:
            events = self._others + [Event(APPENDED, c, last) for c, last in self._appended.items()]
            self._appended, self._others = {}, []
            try:
                async with self.pool.connection(timeout=2.0) as conn:
                    await conn.execute(
                        "SELECT pg_notify(%(ch)s, p) FROM unnest(%(ps)b::text[]) AS p",
                        {"ch": self.channel, "ps": [encode(e, self.sender) for e in events]},
                    )
            except (psycopg.Error, PoolTimeout) as exc:
                log.debug("notifications not sent (peers re-read instead): %s", exc)
                return
