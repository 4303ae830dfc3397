"""The records of a conversation's canonical stream.

Every record is a frozen dataclass with a flat JSON form: the envelope (``offset``, ``id``,
``type``, ``submission_id``, ``attempt``, ``at``) plus the fields of its type. ``to_json`` and
``record_from_json`` are the one stable mapping between the two.

Example::

    rec = UserMessage(id="s1:input", submission_id="s1", message_id="s1", content="hi")
    assert record_from_json(rec.to_json()) == rec
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from hearth.jsontext import JSON, canonical_json, compact_json, holds_unpaired

_ENVELOPE = ("offset", "id", "type", "submission_id", "attempt", "at")
# Fields that may differ when recovery writes the same fact again.
_NOT_CONTENT = frozenset({"offset", "attempt", "at"})


_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text


def now_iso() -> str:
    """The current UTC time in the stream's format (millisecond precision, ``Z`` suffix)."""
    global _second
    millis = int(time.time() * 1000)
    seconds, rest = divmod(millis, 1000)
    cached = _second  # one read: another thread may replace it meanwhile
    if cached[0] != seconds:  # every record is stamped: format the date once per second
        cached = _second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{cached[1]}.{rest:03d}Z"


def iso_from_unix(seconds: float) -> str:
    """Unix seconds in the stream's time format."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def unix_from_iso(text: str) -> float:
    """The stream's time format back to unix seconds."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


@dataclass(frozen=True, kw_only=True)
class Record:
    """Envelope shared by every record type."""

    type: ClassVar[str] = "record"
    # Fields left out of the JSON form (and so of the digest) while None: fields added later,
    # so that records written before them keep their digest.
    omitted_when_none: ClassVar[frozenset[str]] = frozenset()

    id: str
    offset: int = -1
    submission_id: str | None = None
    attempt: int | None = None
    at: str = field(default_factory=now_iso)

    def to_json(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {
            "offset": self.offset,
            "id": self.id,
            "type": self.type,
            "submission_id": self.submission_id,
            "attempt": self.attempt,
            "at": self.at,
        }
        omitted = self.omitted_when_none
        for name in _type_fields(type(self)):
            value = getattr(self, name)
            if value is None and name in omitted:
                continue
            out[name] = value
        return out

    def content_digest(self) -> str:
        """A digest of what the record says, ignoring when and by which attempt it was written."""
        return _digest(self.to_json())

    def encode(self, offset: int) -> tuple[str, str]:
        """The stored form at ``offset`` and the content digest, from one ``to_json``."""
        data = self.to_json()
        digest = _digest(data)
        data["offset"] = offset
        return compact_json(data), digest

    def with_offset(self: _R, offset: int) -> _R:
        return self._evolve({"offset": offset})

    def stamped(self: _R, submission_id: str | None, attempt: int | None) -> _R:
        return self._evolve({"submission_id": submission_id, "attempt": attempt})

    def _evolve(self: _R, envelope: dict[str, Any]) -> _R:
        # A copy with other envelope fields. Not dataclasses.replace: that re-runs __init__ for
        # every field, and every append copies each record twice.
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, **envelope)
        return copy


_R = TypeVar("_R", bound=Record)
_FIELDS: dict[type[Record], tuple[str, ...]] = {}


def _type_fields(cls: type[Record]) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(
            f.name for f in dataclasses.fields(cls) if f.name not in _ENVELOPE
        )
    return names


def _digest(data: dict[str, JSON]) -> str:
    body = {k: v for k, v in data.items() if k not in _NOT_CONTENT}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


RECORD_TYPES: dict[str, type[Record]] = {}


def _register(cls: type[_R]) -> type[_R]:
    RECORD_TYPES[cls.type] = cls
    return cls


@_register
@dataclass(frozen=True, kw_only=True)
class ConversationCreated(Record):
    type: ClassVar[str] = "conversation_created"
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"forked_from"})
    agent: str
    conversation_id: str
    parent: dict[str, str] | None = None
    # A fork's origin (SPEC §17): {"conversation_id", "offset"} of the copied stream.
    forked_from: dict[str, Any] | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class UserMessage(Record):
    type: ClassVar[str] = "user_message"
    message_id: str
    content: JSON


@_register
@dataclass(frozen=True, kw_only=True)
class Signal(Record):
    type: ClassVar[str] = "signal"
    signal_type: str
    body: str = ""
    attributes: dict[str, JSON] = field(default_factory=dict)


@_register
@dataclass(frozen=True, kw_only=True)
class AssistantMessageStarted(Record):
    type: ClassVar[str] = "assistant_message_started"
    message_id: str
    model: str


@_register
@dataclass(frozen=True, kw_only=True)
class AssistantTextDelta(Record):
    type: ClassVar[str] = "assistant_text_delta"
    message_id: str
    seq: int
    delta: str


@_register
@dataclass(frozen=True, kw_only=True)
class AssistantToolCall(Record):
    type: ClassVar[str] = "assistant_tool_call"
    message_id: str
    tool_call_id: str
    name: str
    arguments: JSON


@_register
@dataclass(frozen=True, kw_only=True)
class AssistantMessageCompleted(Record):
    type: ClassVar[str] = "assistant_message_completed"
    message_id: str
    stop_reason: str  # stop | tool_use | length | aborted | error
    text: str = ""
    usage: dict[str, int] | None = None
    error: dict[str, JSON] | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class ToolOutcome(Record):
    type: ClassVar[str] = "tool_outcome"
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"reconciled"})
    message_id: str
    tool_call_id: str
    name: str
    is_error: bool
    content: JSON
    duration_ms: int = 0
    # "done" / "not_done" when the tool's reconcile function decided it (docs/effects.md)
    reconciled: str | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class ToolResultsCommitted(Record):
    type: ClassVar[str] = "tool_results_committed"
    message_id: str
    tool_call_ids: list[str]


@_register
@dataclass(frozen=True, kw_only=True)
class ToolStepSettled(Record):
    type: ClassVar[str] = "tool_step_settled"
    tool_call_id: str
    step: str
    value: JSON


@_register
@dataclass(frozen=True, kw_only=True)
class StateWrite(Record):
    type: ClassVar[str] = "state_write"
    name: str
    value: JSON


@_register
@dataclass(frozen=True, kw_only=True)
class HookSeamCommitted(Record):
    type: ClassVar[str] = "hook_seam_committed"
    hook: str
    message_id: str


@_register
@dataclass(frozen=True, kw_only=True)
class ChildConversationLinked(Record):
    type: ClassVar[str] = "child_conversation_linked"
    tool_call_id: str
    child_conversation_id: str


@_register
@dataclass(frozen=True, kw_only=True)
class Compaction(Record):
    type: ClassVar[str] = "compaction"
    summary: str
    first_kept_offset: int
    tokens_before: int = 0
    usage: dict[str, int] | None = None  # of the summary call(s), for the spending budget
    # Records before ``first_kept_offset`` the model still sees verbatim, after the summary and
    # before the kept tail: the running submission's input and joined messages, when its own
    # tool loop was compacted. None when nothing before ``first_kept_offset`` is kept.
    kept_offsets: list[int] | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class SubmissionSettled(Record):
    type: ClassVar[str] = "submission_settled"
    outcome: str  # completed | failed | aborted
    error: dict[str, JSON] | None = None
    reply: str | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class WaitStarted(Record):
    """A durable tool asked the outside world for a value (§15); the attempt ends after it."""

    type: ClassVar[str] = "wait_started"
    wait_id: str
    tool_call_id: str
    name: str
    prompt: JSON = None
    expires_at: str | None = None  # UTC ISO, like ``at``; None: waits for ever
    # The state writes the paused batch made so far: not committed yet, they are carried over
    # to the attempt that resumes the batch and commit with it (calls that kept their outcome
    # do not run again to make them).
    state_writes: dict[str, JSON] = field(default_factory=dict)


@_register
@dataclass(frozen=True, kw_only=True)
class WaitResolved(Record):
    """The end of a wait: its ``value``, or ``timed_out``, or ``aborted`` with its submission."""

    type: ClassVar[str] = "wait_resolved"
    wait_id: str
    value: JSON = None
    timed_out: bool = False
    aborted: bool = False


def record_from_json(data: dict[str, JSON]) -> Record:
    """Rebuild a record from its JSON form. Unknown fields are an error, so drift is caught."""
    kind = data.get("type")
    cls = RECORD_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown record type {kind!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in data.items() if k != "type"}
    unknown = set(kwargs) - names
    if unknown:
        raise ValueError(f"unknown fields for {kind}: {sorted(unknown)}")
    return cls(**kwargs)


def dumps(record: Record) -> str:
    return compact_json(record.to_json())


def as_stored(record: _R) -> _R:
    """``record`` as a store gives it back: itself, or (when it holds an unpaired surrogate,
    which no store can keep) a copy with U+FFFD in its place."""
    if _plain_text_only(record) or not holds_unpaired(record.to_json()):
        return record
    stored = loads(dumps(record))
    assert isinstance(stored, type(record))
    return stored


_SCALARS = (int, float, bool, type(None))


def _plain_text_only(record: Record) -> bool:
    """Whether every field of ``record`` is a number, a boolean, None or ASCII text: then it
    holds no unpaired surrogate, which is known without encoding it (every append asks)."""
    for value in record.__dict__.values():
        if type(value) is str:
            if not value.isascii():
                return False
        elif type(value) not in _SCALARS:
            return False
    return True


def loads(raw: str | bytes) -> Record:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("a record's JSON form is an object")
    return record_from_json(data)


__all__ = [
    "RECORD_TYPES",
    "AssistantMessageCompleted",
    "AssistantMessageStarted",
    "AssistantTextDelta",
    "AssistantToolCall",
    "ChildConversationLinked",
    "Compaction",
    "ConversationCreated",
    "HookSeamCommitted",
    "Record",
    "Signal",
    "StateWrite",
    "SubmissionSettled",
    "ToolOutcome",
    "ToolResultsCommitted",
    "ToolStepSettled",
    "UserMessage",
    "WaitResolved",
    "WaitStarted",
    "dumps",
    "iso_from_unix",
    "loads",
    "now_iso",
    "record_from_json",
    "unix_from_iso",
]
