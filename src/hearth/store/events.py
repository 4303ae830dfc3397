"""What a store tells the runtime after a commit: admitted, appended, abort, released, settled.

A store publishes an ``Event`` only after the transaction that caused it committed. The SQLite
store publishes from its writer thread into the owning event loop; a store shared by several
processes also feeds the events its peers committed into the same hub, so a waiter never has to
know where a write came from. Events carry ids and offsets, and a settlement written by this
process its settled row as committed: nothing that is not in the tables, so a lost event delays a
waiter but never misleads it.

Example::

    woken = store.events.subscribe("support/c-1")   # arm before reading
    try:
        records = await store.read("support/c-1", after=last)
        if not records:
            await asyncio.wait({woken}, timeout=15)
    finally:
        store.events.unsubscribe("support/c-1", woken)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from hearth.store.rows import Submission

ADMITTED = "admitted"  # a submission was admitted: claimers look for work
APPENDED = "appended"  # records were appended: tails and readers wake
ABORT = "abort"  # an abort intent was stamped: the owning process cancels the attempt
RELEASED = "released"  # a lease was given up without settling: a peer may claim at once
SETTLED = "settled"  # a submission has its outcome: its waiters wake
KINDS = (ADMITTED, APPENDED, ABORT, RELEASED, SETTLED)


@dataclass(frozen=True)
class Event:
    """One committed change. ``offset`` is the conversation's last offset for ``appended``;
    ``submission_id`` names the submission for ``released`` and ``settled``; ``attempt`` is the
    attempt that settled it, when this process wrote the settlement (0 when unknown), and
    ``row`` the settled row as that commit left it (None when a peer settled it: waiters read
    it then)."""

    kind: str
    conversation_id: str
    offset: int = -1
    submission_id: str | None = None
    attempt: int = 0
    row: Submission | None = None


Listener = Callable[[Event], None]
T = TypeVar("T")


class StoreEvents:
    """In-process fan-out of committed changes, with one-shot waiters made lazily.

    Idle conversations and submissions hold nothing: a waiter is dropped when it is removed or
    fired. Listeners (the coordinator) see every event; they must not block.
    """

    def __init__(self) -> None:
        # Waiters per key in an insertion-ordered dict: N followers each dropping their own
        # waiter after an append costs O(N) in all, not O(N²).
        self._appended: dict[str, dict[asyncio.Future[int], None]] = {}
        self._settled: dict[str, dict[asyncio.Future[Submission | None], None]] = {}
        self._listeners: list[Listener] = []

    def publish(self, event: Event) -> None:
        """Deliver one committed change (called on the event loop that owns the waiters)."""
        if event.kind == APPENDED:
            _fire(self._appended.pop(event.conversation_id, None), event.offset)
        elif event.kind == SETTLED and event.submission_id is not None:
            _fire(self._settled.pop(event.submission_id, None), event.row)
        for listener in list(self._listeners):
            listener(event)

    def publish_all(self, events: list[Event]) -> None:
        """Deliver what one commit (or one group of commits) changed: one ``appended`` per
        conversation at its last offset, then the rest in order, so a woken waiter finds the
        records it was woken for."""
        if len(events) == 1:  # (most commits: one append)
            self.publish(events[0])
            return
        appended: dict[str, int] = {}
        for event in events:
            if event.kind == APPENDED:
                last = appended.get(event.conversation_id, -1)
                appended[event.conversation_id] = max(event.offset, last)
        for conversation_id, offset in appended.items():
            self.publish(Event(APPENDED, conversation_id, offset))
        for event in events:
            if event.kind != APPENDED:
                self.publish(event)

    def wake_all(self) -> None:
        """Wake every waiter, of appends (with -1) and of settlements (with None: read the row),
        as if each had its event: after notices may have been lost, each looks again."""
        appended, self._appended = self._appended, {}
        settled, self._settled = self._settled, {}
        for waiters in appended.values():
            _fire(waiters, -1)
        for found in settled.values():
            _fire(found, None)

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` for every event from now on; returns the function that stops it."""
        self._listeners.append(listener)

        def stop() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return stop

    # --- one-shot waiters --------------------------------------------------------------------
    def subscribe(self, conversation_id: str) -> asyncio.Future[int]:
        """A future done at the next append to the conversation. Arm it *before* reading, so
        an append committed during the read is not missed; ``unsubscribe`` when done."""
        return _arm(self._appended, conversation_id)

    def unsubscribe(self, conversation_id: str, fut: asyncio.Future[int]) -> None:
        _disarm(self._appended, conversation_id, fut)

    def watch_settled(self, submission_id: str) -> asyncio.Future[Submission | None]:
        """A future done when the submission settles, with the settled row when this process
        settled it (else None: read it). Arm it before reading the row; ``unwatch_settled`` when
        done."""
        return _arm(self._settled, submission_id)

    def found_settled(self, row: Submission) -> None:
        """Wake the waiters of a submission a read found settled (its event was lost), with
        its row; no listener hears of it."""
        _fire(self._settled.pop(row.id, None), row)

    def unwatch_settled(self, submission_id: str, fut: asyncio.Future[Submission | None]) -> None:
        _disarm(self._settled, submission_id, fut)

    def end_settled_waits(self) -> None:
        """Cancel every settlement waiter: its waiter is to hear of no settlement any more (the
        runtime has stopped), and finds its future cancelled."""
        settled, self._settled = self._settled, {}
        for waiters in settled.values():
            for fut in waiters:
                fut.cancel()

    async def wait(self, conversation_id: str, timeout: float | None = None) -> None:
        """Wait until something is appended to the conversation (or the timeout passes)."""
        fut = self.subscribe(conversation_id)
        try:
            await asyncio.wait({fut}, timeout=timeout)
        finally:
            self.unsubscribe(conversation_id, fut)


Waiters = dict[asyncio.Future[T], None]


def _arm(table: dict[str, Waiters[T]], key: str) -> asyncio.Future[T]:
    fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    table.setdefault(key, {})[fut] = None
    return fut


def _disarm(table: dict[str, Waiters[T]], key: str, fut: asyncio.Future[T]) -> None:
    waiters = table.get(key)
    if waiters is None:
        return
    waiters.pop(fut, None)
    if not waiters:
        table.pop(key, None)


def _fire(waiters: Waiters[T] | None, value: T) -> None:
    for fut in waiters or ():
        if not fut.done():
            fut.set_result(value)


StreamNotifier = StoreEvents  # the name this hub had before it carried every kind of event
