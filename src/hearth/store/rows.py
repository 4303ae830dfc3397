"""The rows a store hands out: submissions, fences, admissions and conversations.

Plain frozen dataclasses, shared by every store and by the runtime above them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
