"""Model context rebuilt from records alone: the latest compaction summary, the records it keeps
verbatim (``kept_offsets``: a running submission's input and joined messages), then every
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


def first_needed_offset(compaction: Compaction) -> int:
    """The first offset the context after ``compaction`` shows: read from there on."""
    kept: list[int] = list(compaction.kept_offsets or ())
    return min([compaction.first_kept_offset, *kept])


def shown_records(records: Sequence[Record]) -> tuple[str | None, Sequence[Record]]:
    """The latest compaction's summary and the records the model sees after it, in order.
    ``records`` must start at or before that compaction's ``first_needed_offset``."""
    for i in range(len(records) - 1, -1, -1):
        rec = records[i]
        if isinstance(rec, Compaction):
            kept = set(rec.kept_offsets or ())
            first = rec.first_kept_offset
            return rec.summary, [r for r in records if r.offset >= first or r.offset in kept]
    return None, records


def build_context(records: Sequence[Record]) -> tuple[str | None, list[Message]]:
    """Return ``(summary, messages)`` for the model from records in stream order. ``records``
    must start at or before the latest compaction's ``first_needed_offset``."""
    summary, shown = shown_records(records)
    return summary, messages_of(shown)


def messages_of(records: Sequence[Record]) -> list[Message]:
    """The model-visible messages of ``records`` (no compaction applied): tool results follow
    their calls, in call order."""
    messages: list[Message] = []
    calls: dict[str, list[ToolCall]] = {}
    position: dict[str, int] = {}  # tool_call_id → its place among its message's calls
    results: list[ToolResult] = []  # outcomes land as calls finish; shown in call order

    def flush() -> None:
        ordered: list[ToolResult] = sorted(results, key=lambda r: position.get(r.tool_call_id, 0))
        messages.extend(ordered)
        results.clear()

    for rec in records:
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
    return messages


_MODEL_VISIBLE = frozenset(
    {"user_message", "signal", "assistant_tool_call", "assistant_message_completed"}
)
