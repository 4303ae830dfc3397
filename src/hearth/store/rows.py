"""The rows a store hands out: submissions, fences, admissions and conversations.

Plain frozen dataclasses, shared by every store and by the runtime above them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hearth.errors import CorruptData
from hearth.records import Record, iso_from_unix, loads

QUEUED = "queued"
RUNNING = "running"
SETTLED = "settled"
JOINED = "joined"
WAITING = "waiting"  # a durable wait is pending: no lease, no attempt runs (§15)
UNSETTLED = (QUEUED, RUNNING)  # what a claimer will run; a waiting submission is at rest
# What holds a conversation: a message admitted meanwhile queues behind it, an abort reaches it.
OPEN = (QUEUED, RUNNING, WAITING)
OPEN_SQL = "(" + ", ".join(f"'{status}'" for status in OPEN) + ")"  # for an IN (...) in SQL
# Unsettled: open, or joined to a response that has not settled yet (SQL, for a WHERE).
UNSETTLED_SQL = f"(status IN {OPEN_SQL} OR (status = '{JOINED}' AND outcome IS NULL))"
DELIVERY_ADMITTED = "admitted"  # a channel delivery whose submissions are admitted
DELIVERY_FAILED = "failed"  # a channel delivery whose routing failed (kept to be replayed)


def counted_attempts(attempt: int, waits: int, releases: int = 0) -> int:
    """The attempts that count toward ``max_attempts``: an attempt that ended by a durable wait,
    or that a graceful shutdown gave back, was not interrupted by a failure, so it does not use
    up the retry budget."""
    return attempt - waits - releases


# The states of a wait row.
WAIT_PENDING = "pending"
WAIT_RESOLVED = "resolved"
WAIT_TIMED_OUT = "timed_out"
WAIT_ABORTED = "aborted"


@dataclass(frozen=True)
class Fence:
    """Proof of ownership: the submission and the attempt number its claim was given."""

    submission_id: str
    attempt: int


@dataclass(frozen=True)
class Held:
    """A lease ``Store.renew_all`` renewed: its claim, and whether an abort intent is stamped on
    the submission (the one sure way an owner hears of an abort whose notice it missed)."""

    fence: Fence
    abort_requested: bool = False


@dataclass(frozen=True)
class Submission:
    """One admitted input: a row of operational state, not part of the stream."""

    id: str
    conversation_id: str
    kind: str  # message | signal | channel | scheduled
    payload: dict[str, Any]
    idempotency_key: str | None
    status: str  # queued | running | waiting | settled | joined
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
    # where it came from: {"channel", "delivery_id"}, {"schedule", "occurrence"}, or None
    source: dict[str, Any] | None = None
    traceparent: str | None = None  # W3C trace context of the admission: attempts continue it
    # Attempts that ended by a durable wait: they do not count toward ``max_attempts``, so the
    # attempts interrupted so far are ``attempt - waits`` (the one running included).
    waits: int = 0
    waiting_since: float | None = None  # while waiting; the deadline moves on by the time waited
    # Attempts a graceful shutdown gave back (``Store.release(graceful=True)``): nor do these
    # count, or a few rolling redeploys in a row failed a long submission ``retry_exhausted``.
    releases: int = 0
    # The state writes of the tool batches the last paused attempt left open (they commit with
    # their batch): ``{conversation_id: {"message_id", "attempt", "writes"}}``; see
    # ``Store.begin_wait``.
    carried: dict[str, Any] | None = None
    # What of the row could not be read (a JSON column changed outside hearth or damaged): its
    # attempt fails it ``corrupt_data`` rather than run on a guess, or stop every claim.
    damage: str | None = None

    @property
    def interruptions(self) -> int:
        """The attempts that count toward ``max_attempts`` (the current one included)."""
        return counted_attempts(self.attempt, self.waits, self.releases)

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
            "source": self.source,
            "traceparent": self.traceparent,
            "waits": self.waits,
            "waiting_since": self.waiting_since,
            "releases": self.releases,
        }


@dataclass(frozen=True)
class TurnView:
    """What an attempt reads at each turn boundary (``Store.turn_view``): the records appended
    after the offset it knew, the conversation's state, and its submission's row."""

    records: list[Record]
    state: dict[str, Any]
    submission: Submission | None


@dataclass(frozen=True)
class Admission:
    """What admission answers: the submission row and whether an earlier one was returned."""

    submission: Submission
    offset: int  # last stream offset at admission (-1: nothing yet)
    deduplicated: bool


@dataclass(frozen=True)
class Blob:
    """An attachment's bytes as the store keeps them: keyed by their SHA-256, with the media
    type of the first stored copy. ``data`` is None when only its size was asked for."""

    sha256: str
    media_type: str
    size: int
    data: bytes | None = None
    created_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "media_type": self.media_type, "size": self.size}


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
    source: dict[str, Any] | None = None
    traceparent: str | None = None  # W3C ``traceparent`` of the admission, kept on the row
    # The bytes of the attachments its payload references, stored in the admission's transaction.
    blobs: tuple[Blob, ...] = ()


@dataclass(frozen=True)
class NewDelivery:
    """A channel delivery as verified: what ``admit_delivery`` and ``fail_delivery`` keep."""

    channel: str
    delivery_id: str
    type: str
    data: Any  # JSON
    body: str  # the raw body, as text
    headers: dict[str, str]  # the headers that matter (never a signature or a token)
    received_at: float  # unix seconds


@dataclass(frozen=True)
class StoredDelivery:
    """A ``deliveries`` row: ``admitted`` (its submissions are admitted) or ``failed``."""

    channel: str
    delivery_id: str
    type: str
    status: str  # admitted | failed
    data: Any
    body: str
    headers: dict[str, str]
    submission_ids: list[str]
    error: dict[str, Any] | None
    attempts: int  # how many times routing ran
    received_at: float
    updated_at: float

    def to_json(self, *, full: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "channel": self.channel,
            "delivery_id": self.delivery_id,
            "type": self.type,
            "status": self.status,
            "submission_ids": self.submission_ids,
            "error": self.error,
            "attempts": self.attempts,
            "received_at": self.received_at,
            "updated_at": self.updated_at,
        }
        if full:
            out.update(data=self.data, body=self.body, headers=self.headers)
        return out


@dataclass(frozen=True)
class DeliveryAdmission:
    """What ``admit_delivery`` answers: the delivery's submissions, and whether the delivery
    had been admitted before (then nothing new was written)."""

    delivery: StoredDelivery
    deduplicated: bool


@dataclass(frozen=True)
class ScheduleCursor:
    """A schedule's durable cursor: occurrences at or before ``cursor`` are never admitted;
    ``spec`` is the cron and zone the cursor was kept for."""

    name: str
    spec: str
    cursor: float  # unix seconds
    last_occurrence: float | None
    updated_at: float


@dataclass
class ConversationInfo:
    conversation_id: str
    agent: str
    last_offset: int
    parent: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


ACTIVE = "active"  # a conversation with a queued, running or waiting submission
IDLE = "idle"  # a conversation with none
CONVERSATION_STATUSES = (ACTIVE, IDLE)


@dataclass(frozen=True)
class ConversationSummary:
    """One line of the conversation list: newest activity first."""

    conversation_id: str
    agent: str
    last_offset: int
    last_activity: float  # unix seconds of its latest append (its creation at first)
    unsettled: int  # its queued and running submissions
    parent: dict[str, str] | None = None

    @property
    def cursor(self) -> tuple[float, str]:
        """Pass as ``before`` to list the conversations after this one."""
        return (self.last_activity, self.conversation_id)


class Row(Protocol):
    """A database row read by column name (``sqlite3.Row``, a psycopg dict row)."""

    def __getitem__(self, key: str, /) -> Any: ...


def submission_from_row(row: Row) -> Submission:
    """The ``Submission`` a ``submissions`` row holds (JSON columns decoded; one that cannot be
    decoded is named in ``damage``, and read as empty)."""
    damage: list[str] = []

    def decoded(column: str, empty: Any) -> Any:
        text = row[column]
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            damage.append(f"its {column} is not JSON ({exc})")
            return empty

    payload = decoded("payload", {})
    error, source = decoded("error", None), decoded("source", None)
    carried = decoded("carried", None)
    return Submission(
        id=row["id"],
        conversation_id=row["conversation_id"],
        kind=row["kind"],
        payload=payload if isinstance(payload, dict) else {},
        idempotency_key=row["idempotency_key"],
        status=row["status"],
        outcome=row["outcome"],
        error=error,
        reply=row["reply"],
        attempt=int(row["attempt"]),
        max_attempts=int(row["max_attempts"]),
        timeout=float(row["timeout"]),
        deadline=_real(row["deadline"]),
        lease_owner=row["lease_owner"],
        lease_expires_at=_real(row["lease_expires_at"]),
        abort_requested_at=_real(row["abort_requested_at"]),
        accepted_at=float(row["accepted_at"]),
        started_at=_real(row["started_at"]),
        settled_at=_real(row["settled_at"]),
        seq=int(row["seq"]),
        joined_to=row["joined_to"],
        source=source,
        traceparent=row["traceparent"],
        waits=int(row["waits"]),
        waiting_since=_real(row["waiting_since"]),
        releases=int(row["releases"]),
        carried=carried if isinstance(carried, dict) else None,
        damage="; ".join(damage) or None,
    )


def stored_record(body: str | bytes, conversation_id: str) -> Record:
    """The record a ``records`` row's body holds; ``CorruptData`` when it holds none."""
    try:
        return loads(body)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CorruptData(
            f"a record of {conversation_id} cannot be read ({type(exc).__name__}: {exc}); the"
            " database was changed outside hearth or is damaged"
        ) from None


def stored_state(pairs: Iterable[tuple[str, str]], conversation_id: str) -> dict[str, Any]:
    """A conversation's state from its ``(name, value)`` rows; ``CorruptData`` naming the
    piece whose value holds no JSON."""
    state: dict[str, Any] = {}
    for name, value in pairs:
        try:
            state[name] = json.loads(value)
        except ValueError as exc:
            raise CorruptData(
                f"the state {name!r} of {conversation_id} cannot be read ({exc}); the database"
                " was changed outside hearth or is damaged"
            ) from None
    return state


def delivery_from_row(row: Row) -> StoredDelivery:
    """The ``StoredDelivery`` a ``deliveries`` row holds."""
    return StoredDelivery(
        channel=row["channel"],
        delivery_id=row["delivery_id"],
        type=row["type"],
        status=row["status"],
        data=json.loads(row["data"]),
        body=row["body"],
        headers=json.loads(row["headers"]),
        submission_ids=json.loads(row["submission_ids"]),
        error=None if row["error"] is None else json.loads(row["error"]),
        attempts=int(row["attempts"]),
        received_at=float(row["received_at"]),
        updated_at=float(row["updated_at"]),
    )


def cursor_from_row(row: Row) -> ScheduleCursor:
    """The ``ScheduleCursor`` a ``schedules`` row holds."""
    return ScheduleCursor(
        name=row["name"],
        spec=row["spec"],
        cursor=float(row["cursor"]),
        last_occurrence=_real(row["last_occurrence"]),
        updated_at=float(row["updated_at"]),
    )


@dataclass(frozen=True)
class Wait:
    """A durable wait of a tool call: pending until resolved, timed out, or aborted."""

    conversation_id: str  # where its wait_started record is (a task's child, perhaps)
    wait_id: str
    submission_id: str
    tool_call_id: str
    name: str
    prompt: Any
    expires_at: float | None  # unix seconds
    created_at: float
    state: str  # pending | resolved | timed_out | aborted
    value: Any = None
    resolved_at: float | None = None
    seq: int = 0

    @property
    def agent(self) -> str:
        return self.conversation_id.split("/", 1)[0]

    @property
    def id(self) -> str:
        """The conversation's id without the agent's name."""
        return self.conversation_id.split("/", 1)[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "wait_id": self.wait_id,
            "agent": self.agent,
            "id": self.id,
            "conversation_id": self.conversation_id,
            "submission_id": self.submission_id,
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "prompt": self.prompt,
            "expires_at": None if self.expires_at is None else iso_from_unix(self.expires_at),
            "state": self.state,
        }


def wait_from_row(row: Row) -> Wait:
    """The ``Wait`` a ``waits`` row holds."""
    value = row["value"]
    return Wait(
        conversation_id=row["conversation_id"],
        wait_id=row["wait_id"],
        submission_id=row["submission_id"],
        tool_call_id=row["tool_call_id"],
        name=row["name"],
        prompt=json.loads(row["prompt"]),
        expires_at=_real(row["expires_at"]),
        created_at=float(row["created_at"]),
        state=row["state"],
        value=None if value is None else json.loads(value),
        resolved_at=_real(row["resolved_at"]),
        seq=int(row["seq"]),
    )


def conversation_from_row(row: Row) -> ConversationInfo:
    """The ``ConversationInfo`` a ``conversations`` row holds."""
    parent = row["parent"]
    return ConversationInfo(
        conversation_id=row["conversation_id"],
        agent=row["agent"],
        last_offset=int(row["last_offset"]),
        parent=None if parent is None else json.loads(parent),
        extra={"created_at": row["created_at"]},
    )


def summary_from_row(row: Row) -> ConversationSummary:
    """The ``ConversationSummary`` of a ``conversations`` row with its ``unsettled`` count."""
    parent = row["parent"]
    return ConversationSummary(
        conversation_id=row["conversation_id"],
        agent=row["agent"],
        last_offset=int(row["last_offset"]),
        last_activity=float(row["last_activity"]),
        unsettled=int(row["unsettled"]),
        parent=None if parent is None else json.loads(parent),
    )


def blob_from_row(row: Row) -> Blob:
    """The ``Blob`` an ``attachments`` row holds (``data`` when it was selected)."""
    try:
        data = row["data"]
    except (KeyError, IndexError):
        data = None
    return Blob(
        sha256=row["sha256"],
        media_type=row["media_type"],
        size=int(row["size"]),
        data=None if data is None else bytes(data),
        created_at=float(row["created_at"]),
    )


def _real(value: float | None) -> float | None:
    return None if value is None else float(value)
