"""The model provider interface and the provider-neutral conversation it is given.

A provider turns a ``ModelRequest`` into a stream of ``ModelEvent``s. Errors are raised as
``hearth.errors.ProviderError`` with ``kind`` transient / overflow / terminal; providers never
retry on their own (retries belong to the durable budget).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from hearth.jsontext import strict_json
from hearth.providers.parts import estimate_chars

# --- the conversation as a provider sees it ---------------------------------------------------


@dataclass(frozen=True)
class UserTurn:
    content: Any  # str, or a list of parts


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class AssistantTurn:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    aborted: bool = False  # cut off by a crash; followed by a stream_interrupted note


@dataclass(frozen=True)
class ToolResult:
    tool_call_id: str
    name: str
    content: Any  # the tool's JSON result, or {"type", "message"} for an error
    is_error: bool = False


@dataclass(frozen=True)
class SystemNote:
    """A signal or other runtime note the model should see (rendered as a user-side note)."""

    kind: str
    text: str


Message = UserTurn | AssistantTurn | ToolResult | SystemNote


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object


@dataclass(frozen=True)
class ModelRequest:
    model: str  # the part after "provider/"
    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    summary: str | None = None  # the latest compaction summary, shown before the messages
    conversation_id: str = ""
    purpose: str = "turn"  # "turn": the agent's own call; "summary": compaction's summary call


# --- what a provider streams back -------------------------------------------------------------


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """A complete tool call (arguments fully received)."""

    call: ToolCall


@dataclass(frozen=True)
class Finished:
    stop_reason: str  # stop | tool_use | length
    usage: dict[str, int] | None = None


ModelEvent = TextDelta | ToolCallEvent | Finished


@runtime_checkable
class ModelProvider(Protocol):
    """One model backend, addressed as ``"{name}/{model}"`` in ``ctx.use_model``."""

    name: str

    def supports(self, model: str) -> bool:
        """Whether this provider serves ``model`` (the part after the slash)."""
        ...

    def context_window(self, model: str) -> int:
        """The model's context window in tokens."""
        ...

    def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        """Stream the response. Cancelling the iteration closes the underlying request."""
        ...

    async def aclose(self) -> None: ...


def estimate_tokens(request: ModelRequest) -> int:
    """A cheap, provider-independent size estimate (about four characters a token)."""
    size = len(request.system) + len(request.summary or "")
    for m in request.messages:
        if isinstance(m, UserTurn):
            if isinstance(m.content, list):
                size += sum(estimate_chars(p) for p in m.content)
            else:
                size += _chars(m.content)
        elif isinstance(m, AssistantTurn):
            size += len(m.text) + sum(_chars(c.arguments) + len(c.name) for c in m.tool_calls)
        elif isinstance(m, ToolResult):
            size += _chars(m.content)
        else:
            size += len(m.text)
    for t in request.tools:
        size += len(t.name) + len(t.description) + _chars(t.parameters)
    return size // 4 + 1


def _chars(value: Any) -> int:
    """The characters ``value`` takes in a request: a string as it is sent, anything else as
    its JSON with every character as itself (a ``\\u`` escape would count six for one)."""
    import json

    if isinstance(value, str):
        return len(value)
    return len(json.dumps(value, ensure_ascii=False, default=str))


# --- rendering helpers shared by the HTTP providers -------------------------------------------

SUMMARY_PREFIX = "Summary of the earlier conversation: "


def system_prompt(request: ModelRequest) -> str:
    """The system prompt, followed by the latest compaction summary when there is one."""
    if not request.summary:
        return request.system
    summary = f"{SUMMARY_PREFIX}{request.summary}"
    return f"{request.system}\n\n{summary}" if request.system else summary


def note_text(note: SystemNote) -> str:
    """How a runtime note reads on the user side of the conversation."""
    return f"[runtime note: {note.kind}] {note.text}"


def result_text(result: ToolResult) -> str:
    """A tool result as text: strings as they are, anything else as JSON; errors marked."""
    import json

    content = result.content
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    return f"error: {text}" if result.is_error else text


def decode_tool_arguments(raw: str) -> dict[str, Any]:
    """A tool call's arguments object; what is not a JSON object is kept as ``{"_raw": raw}``
    (``NaN``, ``Infinity`` and numbers out of a float's range too: no JSON reader, the
    stream's readers included, could take them back)."""
    if not raw.strip():
        return {}
    try:
        value = strict_json(raw)
    except (ValueError, RecursionError):
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}
