"""Plain data handed to callers: receipts of admission and replies of settlement."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hearth.errors import SubmissionAborted, SubmissionFailed
from hearth.ids import ID_RE, MAX_IDEMPOTENCY_KEY, check_id

# The id rules moved to hearth.ids; re-exported here so that old imports keep working.
__all__ = [
    "ID_RE",
    "MAX_IDEMPOTENCY_KEY",
    "AbortResult",
    "Receipt",
    "Reply",
    "check_id",
    "reply_or_raise",
]


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
        """The receipt ``to_json`` gave; ``ValueError`` saying what is wrong with anything else
        (a missing field, a field of another type: ``"false"`` is no boolean)."""
        fields: dict[str, tuple[Any, str]] = {
            "submission_id": (str, "a string"),
            "conversation_id": (str, "a string"),
            "offset": (int, "an integer"),
            "accepted_at": (int | float, "a number"),
            "deduplicated": (bool, "true or false"),
        }
        if not isinstance(data, dict):
            raise ValueError(f"a receipt is a JSON object, not {type(data).__name__}")
        for name, (kind, what) in fields.items():
            value = data.get(name, False if name == "deduplicated" else None)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"a receipt's {name!r} must be {what}, not {value!r}")
        if "/" not in data["conversation_id"]:
            raise ValueError(
                f"a receipt's conversation_id is agent/id, not {data['conversation_id']!r}"
            )
        return cls(
            submission_id=data["submission_id"],
            conversation_id=data["conversation_id"],
            offset=data["offset"],
            accepted_at=float(data["accepted_at"]),
            deduplicated=data.get("deduplicated", False),
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
