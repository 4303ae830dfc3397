"""The rows a store hands out: submissions, fences, admissions and conversations.

Plain frozen dataclasses, shared by every store and by the runtime above them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from hearth.records import iso_from_unix

QUEUED = "queued"
RUNNING = "running"
SETTLED = "settled"
JOINED = "joined"
WAITING = "waiting"  # a durable wait is pending: no lease, no attempt runs (§15)
UNSETTLED = (QUEUED, RUNNING)  # what a claimer will run; a waiting submission is at rest

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
class Submission:
    """One admitted input: a row of operational state, not part of the stream."""

    id: str
    conversation_id: str
    kind: str  # message | signal
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
    # Attempts that ended by a durable wait: they do not count toward ``max_attempts``, so the
    # attempts interrupted so far are ``attempt - waits`` (the one running included).
    waits: int = 0
    waiting_since: float | None = None  # while waiting; the deadline moves on by the time waited

    @property
    def interruptions(self) -> int:
        """The attempts that count toward ``max_attempts`` (the current one included)."""
        return self.attempt - self.waits

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
            "waits": self.waits,
            "waiting_since": self.waiting_since,
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
        waits=int(row["waits"]),
        waiting_since=_real(row["waiting_since"]),
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


def _real(value: float | None) -> float | None:
    return None if value is None else float(value)
