"""The store interface: where records and submissions live, atomically and fenced.

The store knows nothing of models, tools or prompts. It persists, fences and notifies; the
rules of what it writes are in ``hearth.store.rules``. Every implementation passes the same
conformance suite in ``tests/store``.

Two words used below. *Atomic*: the method's writes commit together in one transaction or not
at all. *Fenced*: the write is accepted only while the given ``Fence`` still owns its submission
(the row is ``running`` with that attempt number), checked inside that same transaction; else
``FencedOut`` and nothing is written. Every write publishes its ``Event`` on ``events`` only
after it committed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from hearth.records import Record, WaitStarted
from hearth.store.events import StoreEvents, StreamNotifier
from hearth.store.rows import (
    ACTIVE,
    CONVERSATION_STATUSES,
    IDLE,
    JOINED,
    QUEUED,
    RUNNING,
    SETTLED,
    UNSETTLED,
    WAITING,
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
)

LIST_LIMIT = 100  # the default page of ``list_submissions``
Result = tuple[str, dict[str, Any] | None, str | None]  # a settlement's outcome, error, reply


class Store(ABC):
    """Durable records and submissions. All methods are coroutines.

    A store implements every abstract method; ``settle`` is written once, here, over the
    store's ``settle_batch``."""

    events: StoreEvents
    # Whether processes of different releases may share this store at once (a rolling
    # redeploy): then each claims work of the agents it declares first (``claim``'s ``agents``).
    shared: bool = False
    # What ``open`` found: the schema version the database had (``None``: there was none, and
    # ``open`` created it), and the version it has now. ``hearth migrate`` reports them.
    schema_found: int | None = None
    schema_version: int = 0

    @abstractmethod
    async def open(self, *, create: bool = True) -> None:
        """Create or check the schema. Raises ``SchemaTooNew`` for a newer database. With
        ``create=False``, a database without hearth's schema (a mistyped path or schema name)
        is a ``StoreError``, and nothing is made."""

    @abstractmethod
    async def close(self) -> None:
        """Finish what is in flight and let go of the database. Idempotent."""

    @abstractmethod
    async def ping(self, timeout: float) -> None:
        """Ask the database a trivial question; ``StoreUnavailable`` naming the cause when it
        gives no answer within ``timeout`` seconds (what ``/healthz`` reports)."""

    @abstractmethod
    async def now(self) -> float:
        """The store's clock (unix seconds): leases, deadlines and stamps are computed from it,
        so that every process sharing the database agrees on them. Injectable in tests."""
        ...

    # --- the stream -------------------------------------------------------------------------
    @abstractmethod
    async def append(
        self,
        conversation_id: str,
        records: Sequence[Record],
        *,
        fence: Fence | None = None,
    ) -> list[int]:
        """Append ``records`` as one batch with consecutive offsets; return their offsets.

        Atomic, and fenced when ``fence`` is given. A record whose id already exists is a no-op
        returning its original offset when its content is the same, and raises
        ``IntegrityError`` otherwise (the whole batch is rejected). ``state_write`` records
        update the conversation's state in the same transaction. A batch that starts with the
        conversation's ``conversation_created`` record creates the conversation; any other
        append to an unknown conversation raises ``StoreError``. Offsets are dense and in commit
        order: a reader that has seen offset K never later finds a new record at or below K.
        Publishes ``appended``.
        """
        ...

    @abstractmethod
    async def transact(
        self,
        conversation_id: str,
        fence: Fence,
        work: Callable[[Any], Awaitable[Any]],
        records: Callable[[Any], Sequence[Record]],
        *,
        ids: Sequence[str],
    ) -> list[Record]:
        """Run the application's ``await work(conn)`` on a connection to the store's own
        database and append ``records(its value)`` in that one transaction: both commit, or
        neither. Fenced *before* ``work`` runs (the submission's row is locked for the whole
        transaction, so a stale attempt's work never commits). A record whose id exists fails
        the whole transaction (``IntegrityError``), never a no-op. An exception of ``work`` or
        ``records`` rolls everything back and is raised as it is. ``ids`` are the ids the
        records will have: after a lost connection they are read back, and when all are stored
        (an earlier try committed) they are the answer, without running ``work`` again.
        Returns the records as stored. A store whose database cannot hold the application's
        tables (SQLite) raises ``ConfigurationError`` naming PostgreSQL, and runs nothing.
        Publishes ``appended``.
        """
        ...

    @abstractmethod
    async def read(
        self, conversation_id: str, after: int = -1, limit: int | None = None
    ) -> list[Record]:
        """Records with offset > ``after``, in order, at most ``limit``; each carries its
        offset. An unknown conversation reads empty."""
        ...

    @abstractmethod
    async def read_page(
        self, conversation_id: str, after: int, limit: int, max_bytes: int
    ) -> tuple[list[Record], bool]:
        """At most ``limit`` records with offset > ``after``, in order, ending with the first
        whose stored form brings their total size to ``max_bytes`` or more (so one record is
        read however large it is); and whether more records follow them. What serves records
        to clients (pages, SSE streams) reads this way, so that large records cost a bounded
        amount of memory per read."""
        ...

    @abstractmethod
    async def last_of_type(self, conversation_id: str, record_type: str) -> Record | None:
        """The record of that type with the highest offset, or None."""
        ...

    @abstractmethod
    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None:
        """The conversation's agent, parent and last offset; None before its first admission."""
        ...

    @abstractmethod
    async def get_state(self, conversation_id: str) -> dict[str, Any]:
        """The committed persistent state of the conversation (name → JSON value)."""
        ...

    @abstractmethod
    async def fork(self, source: str, offset: int, target: str) -> ConversationInfo:
        """Create conversation ``target`` as a fork of ``source`` at ``offset`` (SPEC §17):
        its stream is a ``conversation_created{forked_from}`` and copies of the records
        1..``offset`` with fresh ids at their original offsets, its state is the source's as of
        ``offset``, and it has no submissions. Atomic; the source is not written.

        ``ConversationNotFound`` for an unknown source, ``InvalidInput`` for an offset outside
        its stream, ``NotARestPoint`` (naming the nearest ones) when ``offset`` is not a rest
        point (``rules.rest_points``), ``ConversationExists`` when ``target`` exists. Returns
        the new conversation. Publishes ``appended``."""

    # --- submissions ------------------------------------------------------------------------
    @abstractmethod
    async def admit(self, new: NewSubmission) -> Admission:
        """Write the submission row ``queued`` (creating the conversation and its
        ``conversation_created`` record first if needed) and store ``new.blobs``, the bytes of
        the attachments its payload references. Atomic: the caller may acknowledge
        the input once this returns. Same idempotency key and payload → the first submission
        with ``deduplicated=True`` (also after it settled); same key, other payload →
        ``IdempotencyConflict``. Publishes ``admitted``.
        """
        ...

    # --- attachments ------------------------------------------------------------------------
    @abstractmethod
    async def get_attachment(self, sha256: str, *, with_data: bool = True) -> Blob | None:
        """The stored attachment with that SHA-256 (its bytes unless ``with_data`` is False),
        or None. ``admit`` stores them, from ``NewSubmission.blobs``, in its transaction: the
        same bytes are stored once, with the media type of the first copy, and never
        rewritten."""
        ...

    @abstractmethod
    async def collect_attachments(self, *, dry_run: bool = False) -> list[Blob]:
        """Delete every attachment that no submission and no record references, in one
        transaction guarded by that condition (an admission that reuses stored bytes at the same
        time keeps them); return what was freed (without bytes). ``dry_run`` only lists."""
        ...

    @abstractmethod
    async def get_submission(self, submission_id: str) -> Submission | None:
        """The submission row, or None."""
        ...

    async def turn_view(self, conversation_id: str, after: int, submission_id: str) -> TurnView:
        """``read(conversation_id, after)``, ``get_state(conversation_id)`` and
        ``get_submission(submission_id)`` together: what an attempt reads at each turn
        boundary. A store may answer all three in one round trip."""
        return TurnView(
            await self.read(conversation_id, after=after),
            await self.get_state(conversation_id),
            await self.get_submission(submission_id),
        )

    @abstractmethod
    async def get_submissions(self, submission_ids: Sequence[str]) -> list[Submission]:
        """The rows of those of ``submission_ids`` that exist, in admission order (one read
        for many: what settlement waits look at)."""
        ...

    @abstractmethod
    async def list_submissions(
        self,
        conversation_id: str | None = None,
        statuses: Sequence[str] | None = None,
        *,
        after: int = 0,
        limit: int = LIST_LIMIT,
        before: int | None = None,
    ) -> list[Submission]:
        """At most ``limit`` submissions in admission order, optionally filtered, starting
        after the cursor ``after`` (the ``seq`` of the last row of the previous page). Given
        ``before`` (a ``seq``; a large number for the newest), the page ends there instead:
        the newest submissions before it, newest first, read from the newest back."""
        ...

    @abstractmethod
    async def count_submissions(
        self, conversation_id: str | None = None
    ) -> dict[tuple[str, str | None], int]:
        """How many submissions there are (of one conversation, or of all) by status and
        outcome, counted by the database (an operator's view of a large store)."""
        ...

    @abstractmethod
    async def latest_settled(
        self, limit: int, conversation_id: str | None = None
    ) -> list[Submission]:
        """The last ``limit`` settled submissions in admission order (of one conversation, or
        of all), newest first; read from the newest back, never every row."""
        ...

    @abstractmethod
    async def list_conversations(
        self,
        agent: str | None = None,
        status: str | None = None,
        *,
        before: tuple[float, str] | None = None,
        limit: int = LIST_LIMIT,
    ) -> list[ConversationSummary]:
        """At most ``limit`` conversations, newest activity first (ties: by id, descending),
        optionally of one ``agent`` and with ``status`` ``"active"`` (a queued or running
        submission) or ``"idle"``, starting after the cursor ``before`` (the ``cursor`` of the
        last row of the previous page). Reads one page through an index, never every row."""
        ...

    @abstractmethod
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
        """Claim up to ``limit`` runnable submissions, at most one per conversation, oldest
        first, and return them in admission order. ``aborting_only``: only those whose abort
        is stamped (they settle at once, with no model work: a process whose every worker is
        busy still takes them).

        With ``agents`` (the names the claimer declares), a submission of another agent is
        claimed only once ``others_after`` seconds have passed since it was accepted: during a
        rolling redeploy, a process of the release that declares a new agent takes its work, and
        one of the older release (which would settle it ``agent_missing``) only when none did.

        Runnable: the oldest unsettled submission of its conversation, when it is ``queued``,
        or ``running`` with an expired lease, and no other submission of its conversation is
        running. Atomic per claimed row, and safe against concurrent claimers on the same
        database: a submission is claimed by one of them only. Claiming sets ``running``,
        increments ``attempt`` (the new fence), sets the lease to ``now() + lease_s``,
        ``started_at`` once and ``deadline`` once (first attempt's start + timeout).
        """
        ...

    @abstractmethod
    async def renew_all(self, owner: str, lease_s: float) -> list[Held]:
        """Extend to ``now() + lease_s`` every lease ``owner`` holds on a running submission, in
        one statement; return the leases still held (a claim missing from them was lost), each
        saying whether an abort is stamped on its submission."""
        ...

    @abstractmethod
    async def release(self, fence: Fence, owner: str, *, graceful: bool = False) -> bool:
        """Give the lease up without settling (graceful shutdown, a failed attempt), so the next
        owner takes over at once; False when ``owner`` no longer held that claim. Publishes
        ``released``. A ``graceful`` release (a shutdown's) counts in the row's ``releases``:
        that attempt does not count toward ``max_attempts``."""
        ...

    @abstractmethod
    async def expire_owners(self, owners: Sequence[str]) -> int:
        """Expire every lease held by these (dead) owners; return how many. Publishes
        ``released`` for each."""
        ...

    @abstractmethod
    async def lease_owners(self) -> list[str]:
        """Distinct owners of running submissions."""
        ...

    @abstractmethod
    async def request_abort(self, conversation_id: str) -> list[str]:
        """Stamp an abort intent (keeping an earlier stamp) on every queued, running or waiting
        submission of the conversation, and every one joined to a response that has not
        settled; return their ids in admission order. A waiting one ends
        its pending waits (``wait_resolved{aborted: true}``) and becomes ``queued``, so that a
        claimer settles it aborted. Atomic. Publishes ``abort`` when any was stamped."""
        ...

    # --- durable waits ----------------------------------------------------------------------
    @abstractmethod
    async def begin_wait(
        self,
        fence: Fence,
        started: Sequence[tuple[str, WaitStarted]],
        carried: Mapping[str, Any] | None = None,
    ) -> None:
        """Pause the attempt for its durable waits: append each ``(conversation_id, record)``
        ``wait_started`` (a wait started by an earlier attempt and still pending is not passed
        again), open a pending ``waits`` row for each, and set the submission ``waiting``
        without a lease, counting the attempt in ``waits``, stamping ``waiting_since`` and
        keeping ``carried`` (the open batches' state writes, JSON; None clears it) for the
        attempt that resumes it to read as ``Submission.carried``.
        Atomic and fenced; ``AbortRequested`` (nothing written) when an abort intent is stamped
        on the submission, ``StoreError`` when no wait of the submission would be pending.
        Publishes ``appended``."""
        ...

    @abstractmethod
    async def resolve_wait(self, conversation_id: str, wait_id: str, value: Any) -> Wait:
        """Record ``wait_resolved{value}`` once and, when no other wait of its submission is
        pending, make the submission ``queued`` again (its deadline moved on by the time it
        waited). Atomic; checks that the submission is ``waiting``. An identical repeat returns
        the wait without writing (also after the submission settled); ``WaitNotFound`` for an
        unknown wait, ``WaitConflict`` for another value, a wait that timed out or was aborted,
        or a submission that no longer waits. Publishes ``appended`` and ``admitted``."""
        ...

    @abstractmethod
    async def expire_waits(self, limit: int = LIST_LIMIT) -> list[Wait]:
        """End up to ``limit`` pending waits whose ``expires_at`` has passed, each as
        ``resolve_wait`` would but with ``wait_resolved{timed_out: true}``; return them."""
        ...

    @abstractmethod
    async def get_wait(self, conversation_id: str, wait_id: str) -> Wait | None:
        """The wait row, or None."""
        ...

    @abstractmethod
    async def list_waits(
        self, conversation_id: str | None = None, *, after: int = 0, limit: int = LIST_LIMIT
    ) -> list[Wait]:
        """Pending waits in the order they started, after the cursor ``after`` (a ``seq``)."""
        ...

    @abstractmethod
    async def next_wait_expiry(self) -> float | None:
        """The earliest ``expires_at`` of a pending wait, or None."""
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
        ``record`` and set the row to ``settled``, atomic and fenced (so a second settlement
        is ``FencedOut``). Settles the submissions joined to it too, each with its own
        ``submission_settled`` record (``rules.settlement``). Returns the offset of the
        settlement record. Publishes ``appended`` and ``settled`` for each.
        """
        return await self.settle_batch(fence, [*records_before, record], (outcome, error, reply))

    @abstractmethod
    async def settle_batch(self, fence: Fence, batch: list[Record], result: Result) -> int:
        """``settle`` as a store does it: ``batch`` ends with the settlement record, ``result``
        is ``(outcome, error, reply)``."""

    @abstractmethod
    async def join(self, host: Fence, submission_id: str, records: Sequence[Record]) -> bool:
        """Mark a queued submission of the host's conversation ``joined`` to the running
        ``host`` and append ``records`` (its ``user_message``), atomic and fenced by the host;
        False (nothing written) when it is not queued in that conversation."""
        ...

    async def join_many(self, host: Fence, joins: Sequence[tuple[str, Sequence[Record]]]) -> int:
        """``join`` each of ``joins`` (a submission id and its records) in order, stopping at
        the first that does not join; how many joined. Fenced by the host as ``join``; a store
        may write them in one transaction, so a crash leaves a prefix of them joined (none, some
        or all), never one without those before it."""
        joined = 0
        for submission_id, records in joins:
            if not await self.join(host, submission_id, records):
                break
            joined += 1
        return joined

    # --- inputs from outside: channel deliveries and schedule cursors -------------------------
    @abstractmethod
    async def admit_delivery(
        self, delivery: NewDelivery, submissions: Sequence[NewSubmission]
    ) -> DeliveryAdmission:
        """Admit every one of ``submissions`` (as ``admit`` does, in order) and write the
        delivery's row ``admitted`` with their ids, all in one transaction. When the delivery
        (``channel``, ``delivery_id``) is already admitted, nothing is written and its first
        result comes back with ``deduplicated=True``; a ``failed`` one is admitted now. Two
        processes admitting the same delivery at once admit it once."""

    @abstractmethod
    async def fail_delivery(self, delivery: NewDelivery, error: dict[str, Any]) -> StoredDelivery:
        """Keep a delivery whose routing failed: its row becomes ``failed`` with ``error`` and
        one more attempt. An ``admitted`` delivery is left as it is (and returned)."""

    @abstractmethod
    async def get_delivery(self, channel: str, delivery_id: str) -> StoredDelivery | None:
        """The delivery's row, or None."""

    @abstractmethod
    async def list_deliveries(
        self, channel: str, *, status: str | None = None, limit: int = LIST_LIMIT
    ) -> list[StoredDelivery]:
        """The channel's deliveries, newest first, optionally of one status."""

    @abstractmethod
    async def open_schedule(self, name: str, spec: str, now: float) -> ScheduleCursor:
        """The schedule's cursor: created at ``now`` for a schedule never seen (nothing before
        it is ever admitted), moved to ``now`` when its ``spec`` (cron and zone) changed, else
        as stored. Atomic; of processes opening a changed schedule at once, one moves it."""

    @abstractmethod
    async def admit_occurrence(
        self, name: str, spec: str, cursor: float, occurrence: float, new: NewSubmission
    ) -> Admission | None:
        """Compare and set: when the schedule's cursor is still ``cursor`` under ``spec``,
        move it (and ``last_occurrence``) to ``occurrence`` and admit ``new``, in one
        transaction. None, with nothing written, when another process moved it first."""

    @abstractmethod
    async def list_schedules(self) -> list[ScheduleCursor]:
        """Every schedule cursor, by name."""


async def all_submissions(
    store: Store, conversation_id: str | None = None, statuses: Sequence[str] | None = None
) -> list[Submission]:
    """Every matching submission, read page by page (an operator's view, not a hot path)."""
    found: list[Submission] = []
    while True:
        after = found[-1].seq if found else 0
        page = await store.list_submissions(conversation_id, statuses, after=after)
        found += page
        if len(page) < LIST_LIMIT:
            return found


__all__ = [
    "ACTIVE",
    "CONVERSATION_STATUSES",
    "IDLE",
    "JOINED",
    "LIST_LIMIT",
    "QUEUED",
    "RUNNING",
    "SETTLED",
    "UNSETTLED",
    "WAITING",
    "Admission",
    "Blob",
    "ConversationInfo",
    "ConversationSummary",
    "DeliveryAdmission",
    "Fence",
    "Held",
    "NewDelivery",
    "NewSubmission",
    "ScheduleCursor",
    "Store",
    "StoreEvents",
    "StoredDelivery",
    "StreamNotifier",
    "Submission",
    "TurnView",
    "Wait",
    "all_submissions",
]
