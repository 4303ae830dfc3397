"""The records that resolve a tool batch: one outcome per call, then the batch's commit."""

from __future__ import annotations

from typing import Any

from hearth.records import AssistantToolCall, ToolOutcome, ToolResultsCommitted
from hearth.runtime.recovery import InterruptedTool, MessageView


def call_outcome(
    call: AssistantToolCall, content: Any, duration_ms: int = 0, *, is_error: bool = False
) -> ToolOutcome:
    """The outcome of one call the model made (successful unless ``is_error``)."""
    return _outcome(call.message_id, call, content, is_error=is_error, duration_ms=duration_ms)


def error_outcome(
    call: AssistantToolCall, kind: str, message: str, duration_ms: int = 0, **more: Any
) -> ToolOutcome:
    """A call's error outcome: ``{"type": kind, "message": message, **more}``."""
    content = {"type": kind, "message": message, **more}
    return call_outcome(call, content, duration_ms, is_error=True)


def interrupted_outcome(message_id: str, tool: InterruptedTool) -> ToolOutcome:
    """The error outcome of a call cut off by an interruption: not re-run, outcome unknown."""
    content: dict[str, Any] = {
        "type": "interrupted",
        "message": f"The call to {tool.name} was cut off by an interruption; it may or may not "
        "have taken effect. Its outcome is unknown.",
    }
    if tool.child_conversation_id:
        content["child_conversation_id"] = tool.child_conversation_id
    return _outcome(message_id, tool, content, is_error=True)


def batch_committed(view: MessageView) -> ToolResultsCommitted:
    """The record that closes the tool batch of one assistant message."""
    return ToolResultsCommitted(
        id=f"{view.message_id}:committed",
        message_id=view.message_id,
        tool_call_ids=[c.tool_call_id for c in view.calls],
    )


def _outcome(
    message_id: str,
    call: AssistantToolCall | InterruptedTool,
    content: Any,
    *,
    is_error: bool,
    duration_ms: int = 0,
) -> ToolOutcome:
    # The id is fixed by the call, so writing an outcome twice is a no-op.
    return ToolOutcome(
        id=f"{message_id}:outcome:{call.tool_call_id}",
        message_id=message_id,
        tool_call_id=call.tool_call_id,
        name=call.name,
        is_error=is_error,
        content=content,
        duration_ms=duration_ms,
    )
