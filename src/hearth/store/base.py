"""The store interface: where records and submissions live, atomically and fenced.

The store knows nothing of models, tools or prompts. Every implementation (SQLite, PostgreSQL)
passes the same conformance suite in ``tests/store``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from hearth.records import Record

QUEUED = "queued"
RUNNING = "running"
SETTLED = "settled"
JOINED = "joined"
UNSETTLED = (QUEUED, RUNNING)


@dataclass(frozen=True)
class Fence:
    """Proof of ownership: the submission and the attempt number its claim was given."""

    submission_id: str
    attempt: int


@dataclass(frozen=True)
class Submission:
    """One admitted input: a row of operational state, not part of the stream."""

    id: str
    conversation_id: str
    kind: str  # message | signal
    payload: dict[str, Any]
    idempotency_key: str | None
    status: str  # queued | running | settled | joined
    outcome: str | None
    error: dict[str, Any] | None
    reply: str | None
    attempt: int
    max_attempts: int
    timeout: float
    deadline: float | None  # unix seconds
    lease_owner: str | None
    lease_expires_at: float | None
    abort_requested_at: float | None
    accepted_at: float
    started_at: float | None
    settled_at: float | None
    seq: int = 0  # admission order across the store
    joined_to: str | None = None

    @property
    def agent(self) -> str:
        return self.conversation_id.split("/", 1)[0]

    @property
    def fence(self) -> Fence:
        return Fence(self.id, self.attempt)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "conversation_id": self.conversation_id,
            "kind": self.kind,
            "payload": self.payload,
            "idempotency_key": self.idempotency_key,
            "status": self.status,
            "outcome": self.outcome,
            "error": self.error,
            "reply": self.reply,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "deadline": self.deadline,
            "lease_owner": self.lease_owner,
            "lease_expires_at": self.lease_expires_at,
            "abort_requested_at": self.abort_requested_at,
            "accepted_at": self.accepted_at,
            "started_at": self.started_at,
            "settled_at": self.settled_at,
            "joined_to": self.joined_to,
        }


@dataclass(frozen=True)
class Admission:
    """What admission answers: the submission row and whether an earlier one was returned."""

    submission: Submission
    offset: int  # last stream offset at admission (-1: nothing yet)
    deduplicated: bool


@dataclass(frozen=True)
class NewSubmission:
    conversation_id: str
    agent: str
    kind: str
    payload: dict[str, Any]
    idempotency_key: str | None = None
    max_attempts: int = 10
    timeout: float = 3600.0
    parent: dict[str, str] | None = None


@dataclass
class ConversationInfo:
    conversation_id: str
    agent: str
    last_offset: int
    parent: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class StreamNotifier:
    """In-process wake-ups: one ``asyncio.Condition``-like waiter per conversation, made lazily.

    Stores call ``publish`` after a commit; readers ``wait`` for an offset past the one they hold.
    Idle conversations hold nothing: waiters are dropped when their last reader leaves.
    """

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._waiters: dict[str, list[asyncio.Future[int]]] = {}
        self._any: list[asyncio.Future[None]] = []

    def publish(self, conversation_id: str, last_offset: int) -> None:
        waiters = self._waiters.pop(conversation_id, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(last_offset)
        anys, self._any = self._any, []
        for a in anys:
            if not a.done():
                a.set_result(None)

    def subscribe(self, conversation_id: str) -> asyncio.Future[int]:
        """A future done at the next append to the conversation. Arm it *before* reading, so
        an append committed during the read is not missed; ``unsubscribe`` when done."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(conversation_id, []).append(fut)
        return fut

    def unsubscribe(self, conversation_id: str, fut: asyncio.Future[int]) -> None:
        waiters = self._waiters.get(conversation_id)
        if waiters is not None:
            if fut in waiters:
                waiters.remove(fut)
            if not waiters:
                self._waiters.pop(conversation_id, None)

    async def wait(self, conversation_id: str, timeout: float | None = None) -> None:
        """Wait until something is appended to the conversation (or the timeout passes)."""
        fut = self.subscribe(conversation_id)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass
        finally:
            self.unsubscribe(conversation_id, fut)

    async def wait_any(self, timeout: float | None = None) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._any.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass
        finally:
            if fut in self._any:
                self._any.remove(fut)


@runtime_checkable
class Store(Protocol):
    """Durable records and submissions. All methods are coroutines; all writes are atomic."""

    notifier: StreamNotifier

    async def open(self) -> None:
        """Create or check the schema. Raises ``SchemaTooNew`` for a newer database."""

    async def close(self) -> None: ...

    # --- the stream -------------------------------------------------------------------------
    async def append(
        self,
        conversation_id: str,
        records: Sequence[Record],
        *,
        fence: Fence | None = None,
    ) -> list[int]:
        """Append ``records`` as one atomic batch with consecutive offsets; return their offsets.

        A record whose id already exists is a no-op returning its original offset when its
        content is the same, and raises ``IntegrityError`` otherwise (the whole batch is
        rejected). With ``fence``, the batch is accepted only while that submission is
        ``running`` with that attempt number, else ``FencedOut``. ``state_write`` records also
        update the conversation's state. Records are stored with their ``offset`` set.
        """
        ...

    async def read(
        self, conversation_id: str, after: int = -1, limit: int | None = None
    ) -> list[Record]:
        """Records with offset > ``after``, in order, at most ``limit``."""
        ...

    async def last_offset(self, conversation_id: str) -> int:
        """The last offset of the stream, -1 when empty or unknown."""
        ...

    async def last_of_type(self, conversation_id: str, record_type: str) -> Record | None: ...

    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None: ...

    async def list_conversations(self, limit: int = 100) -> list[ConversationInfo]: ...

    async def get_state(self, conversation_id: str) -> dict[str, Any]:
        """The committed persistent state of the conversation (name → JSON value)."""
        ...

    # --- submissions ------------------------------------------------------------------------
    async def admit(self, new: NewSubmission) -> Admission:
        """Write the submission row (creating the conversation and its ``conversation_created``
        record if needed) in one transaction. Same idempotency key and payload → the first
        submission with ``deduplicated=True``; same key, other payload → ``IdempotencyConflict``.
        """
        ...

    async def get_submission(self, submission_id: str) -> Submission | None: ...

    async def list_submissions(
        self, conversation_id: str | None = None, statuses: Sequence[str] | None = None
    ) -> list[Submission]:
        """Submissions in admission order, optionally filtered."""
        ...

    async def claim(
        self,
        owner: str,
        lease_s: float,
        limit: int,
        *,
        now: float | None = None,
        exclude_conversations: Sequence[str] = (),
    ) -> list[Submission]:
        """Claim up to ``limit`` runnable submissions, at most one per conversation.

        Runnable: the oldest unsettled submission of its conversation, when it is ``queued``,
        or ``running`` with an expired lease. Claiming sets ``running``, increments ``attempt``,
        sets the lease, ``started_at`` and ``deadline`` (first attempt's start + timeout).
        """
        ...

    async def renew(self, fence: Fence, owner: str, lease_s: float) -> bool:
        """Extend the lease; False when the claim was lost."""
        ...

    async def release(self, fence: Fence, owner: str) -> bool:
        """Give the lease up without settling, so the next owner can take over at once."""
        ...

    async def expire_owners(self, owners: Sequence[str]) -> int:
        """Expire every lease held by these (dead) owners; return how many."""
        ...

    async def lease_owners(self) -> list[str]:
        """Distinct owners of running submissions."""
        ...

    async def request_abort(self, conversation_id: str) -> list[str]:
        """Stamp an abort intent on every unsettled submission of the conversation."""
        ...

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
        """Settle exactly once: append ``records_before`` then the ``submission_settled``
        ``record`` and set the row to ``settled``, fenced, in one transaction. Settles the
        submissions joined to it too (each with its own ``submission_settled`` record).
        Returns the offset of the settlement record.
        """
        ...

    async def settle_queued(
        self, submission_id: str, record: Record, *, outcome: str, error: dict[str, Any] | None
    ) -> int | None:
        """Settle a ``queued`` submission (abort before it ever ran) with a compare-and-set;
        None when it was no longer queued."""
        ...

    async def join(self, host: Fence, submission_id: str, records: Sequence[Record]) -> bool:
        """Mark a queued submission ``joined`` to the running ``host`` and append ``records``
        (its ``user_message``) fenced by the host, in one transaction; False if not queued."""
        ...
