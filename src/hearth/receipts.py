"""Plain data handed to callers: receipts of admission and replies of settlement."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from hearth.errors import InvalidId, SubmissionAborted, SubmissionFailed

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_IDEMPOTENCY_KEY = 256


def check_id(id: str) -> str:
    if not isinstance(id, str) or not ID_RE.match(id):
        raise InvalidId(
            f"conversation id {id!r} must match {ID_RE.pattern} (1-128 letters, digits, . _ : -)"
        )
    return id


@dataclass(frozen=True)
class Receipt:
    """Proof of admission. Plain data: keep it, and ``read`` the outcome from any process."""

    submission_id: str
    conversation_id: str
    offset: int  # the stream's last offset at admission; the outcome comes after it
    accepted_at: float
    deduplicated: bool = False

    @property
    def agent(self) -> str:
        return self.conversation_id.split("/", 1)[0]

    @property
    def id(self) -> str:
        return self.conversation_id.split("/", 1)[1]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Receipt:
        return cls(
            submission_id=str(data["submission_id"]),
            conversation_id=str(data["conversation_id"]),
            offset=int(data["offset"]),
            accepted_at=float(data["accepted_at"]),
            deduplicated=bool(data.get("deduplicated", False)),
        )


@dataclass(frozen=True)
class Reply:
    """A completed submission's final text."""

    text: str
    submission_id: str
    outcome: str = "completed"


@dataclass(frozen=True)
class AbortResult:
    aborted: bool
    submission_ids: list[str]


def reply_or_raise(
    submission_id: str, outcome: str | None, reply: str | None, error: dict[str, Any] | None
) -> Reply:
    """Turn a settlement into a ``Reply``, or raise ``SubmissionFailed``/``SubmissionAborted``."""
    if outcome == "completed":
        return Reply(reply or "", submission_id, outcome)
    if outcome == "aborted":
        raise SubmissionAborted(submission_id, error)
    raise SubmissionFailed(submission_id, error)
