"""The rows a store hands out: submissions, fences, admissions and conversations.

Plain frozen dataclasses, shared by every store and by the runtime above them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    traceparent: str | None = None  # W3C trace context of the admission: attempts continue it

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
            "traceparent": self.traceparent,
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
    traceparent: str | None = None  # W3C ``traceparent`` of the admission, kept on the row


@dataclass
class ConversationInfo:
    conversation_id: str
    agent: str
    last_offset: int
    parent: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Row(Protocol):
    """A database row read by column name (``sqlite3.Row``, a psycopg dict row)."""

    def __getitem__(self, key: str, /) -> Any: ...


def submission_from_row(row: Row) -> Submission:
    """The ``Submission`` a ``submissions`` row holds (JSON columns decoded)."""
    return Submission(
        id=row["id"],
        conversation_id=row["conversation_id"],
        kind=row["kind"],
        payload=json.loads(row["payload"]),
        idempotency_key=row["idempotency_key"],
        status=row["status"],
        outcome=row["outcome"],
        error=None if row["error"] is None else json.loads(row["error"]),
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
        traceparent=row["traceparent"],
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


def _real(value: float | None) -> float | None:
    return None if value is None else float(value)
