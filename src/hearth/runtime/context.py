"""Model context rebuilt from records alone: the latest compaction summary, then every
model-visible record from its ``first_kept_offset`` on."""

from __future__ import annotations

from collections.abc import Sequence

from hearth.providers.base import AssistantTurn, Message, SystemNote, ToolCall, ToolResult, UserTurn
from hearth.records import (
    AssistantMessageCompleted,
    AssistantToolCall,
    Compaction,
    Record,
    Signal,
    ToolOutcome,
    UserMessage,
)

STREAM_INTERRUPTED_NOTE = (
    "Your previous response was cut off by an interruption; the text above is what was saved. "
    "Continue from where it stops without repeating it."
)
_NOTE_TEXT = {"stream_interrupted": STREAM_INTERRUPTED_NOTE}


def signal_text(sig: Signal) -> str:
    return sig.body or _NOTE_TEXT.get(sig.signal_type, sig.signal_type.replace("_", " "))


def build_context(records: Sequence[Record]) -> tuple[str | None, list[Message]]:
    """Return ``(summary, messages)`` for the model from records in stream order. ``records``
    must start at or before the latest compaction's ``first_kept_offset``."""
    summary: str | None = None
    start = 0
    for rec in reversed(records):
        if isinstance(rec, Compaction):
            summary = rec.summary
            start = next(
                (i for i, r in enumerate(records) if r.offset >= rec.first_kept_offset),
                len(records),
            )
            break
    messages: list[Message] = []
    calls: dict[str, list[ToolCall]] = {}
    for rec in records[start:]:
        if isinstance(rec, UserMessage):
            messages.append(UserTurn(rec.content))
        elif isinstance(rec, Signal):
            messages.append(SystemNote(rec.signal_type, signal_text(rec)))
        elif isinstance(rec, AssistantToolCall):
            args = rec.arguments if isinstance(rec.arguments, dict) else {"_": rec.arguments}
            calls.setdefault(rec.message_id, []).append(ToolCall(rec.tool_call_id, rec.name, args))
        elif isinstance(rec, AssistantMessageCompleted):
            own = tuple(calls.pop(rec.message_id, ()))
            if rec.text or own:
                messages.append(
                    AssistantTurn(rec.text, own, aborted=rec.stop_reason in ("aborted", "error"))
                )
        elif isinstance(rec, ToolOutcome):
            messages.append(ToolResult(rec.tool_call_id, rec.name, rec.content, rec.is_error))
    return summary, messages
