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
    text = sig.body or _NOTE_TEXT.get(sig.signal_type, sig.signal_type.replace("_", " "))
    when = sig.attributes.get("scheduled_for")  # a schedule's signal says which occurrence
    return text if when is None else f"{text} (scheduled for {when})"


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
    position: dict[str, int] = {}  # tool_call_id → its place among its message's calls
    results: list[ToolResult] = []  # outcomes land as calls finish; shown in call order

    def flush() -> None:
        ordered: list[ToolResult] = sorted(results, key=lambda r: position.get(r.tool_call_id, 0))
        messages.extend(ordered)
        results.clear()

    for rec in records[start:]:
        if isinstance(rec, ToolOutcome):
            results.append(ToolResult(rec.tool_call_id, rec.name, rec.content, rec.is_error))
            continue
        if results and rec.type in _MODEL_VISIBLE:
            flush()
        if isinstance(rec, UserMessage):
            messages.append(UserTurn(rec.content))
        elif isinstance(rec, Signal):
            messages.append(SystemNote(rec.signal_type, signal_text(rec)))
        elif isinstance(rec, AssistantToolCall):
            args = rec.arguments if isinstance(rec.arguments, dict) else {"_": rec.arguments}
            own = calls.setdefault(rec.message_id, [])
            position[rec.tool_call_id] = len(own)
            own.append(ToolCall(rec.tool_call_id, rec.name, args))
        elif isinstance(rec, AssistantMessageCompleted):
            own_calls = tuple(calls.pop(rec.message_id, ()))
            if rec.text or own_calls:
                messages.append(
                    AssistantTurn(
                        rec.text, own_calls, aborted=rec.stop_reason in ("aborted", "error")
                    )
                )
    flush()
    return summary, messages


_MODEL_VISIBLE = frozenset(
    {"user_message", "signal", "assistant_tool_call", "assistant_message_completed"}
)
