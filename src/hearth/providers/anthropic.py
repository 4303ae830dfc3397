"""The Anthropic Messages client (``POST /v1/messages`` with ``stream: true``).

The conversation is sent as alternating user/assistant messages of content blocks; the streamed
events are folded back into hearth's ``TextDelta`` / ``ToolCallEvent`` / ``Finished``. The client
never retries: failures come out as classified ``ProviderError``s.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2

from hearth.errors import ProviderError
from hearth.providers.base import (
    AssistantTurn,
    Finished,
    ModelRequest,
    ToolCall,
    ToolResult,
    UserTurn,
    decode_tool_arguments,
    note_text,
    result_text,
    system_prompt,
)
from hearth.providers.failures import classify_failure, error_details, retry_after_seconds
from hearth.providers.http import HTTPProvider
from hearth.providers.parts import Block, FileRules, TextBlock, user_blocks
from hearth.providers.windows import DEFAULT_ANTHROPIC_WINDOW, context_window_for, takes_images
from hearth.sse import SSEEvent

__all__ = ["AnthropicProvider"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"

_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_use",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}
_TRANSIENT_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


# --- request ------------------------------------------------------------------------------------


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def file_rules(model: str, window: int) -> FileRules:
    """What a Claude model takes: images and PDF documents (as base64 ``image``/``document``
    blocks) when the model table says it takes images, text files up to a quarter of its
    window (in characters ≈ tokens)."""
    images = takes_images(model, default=True)
    return FileRules(images=images, documents=images, text_limit=max(window, 1000))


def _user_blocks(content: Any, rules: FileRules) -> list[dict[str, Any]]:
    return [_wire_block(b) for b in user_blocks(content, rules)]


def _wire_block(block: Block) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return _text_block(block.text)
    source = {"type": "base64", "media_type": block.media_type, "data": block.data}
    return {"type": block.kind, "source": source}


def _result_block(result: ToolResult) -> dict[str, Any]:
    content = result.content
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": result.tool_call_id,
        "content": content if isinstance(content, str) else json.dumps(content, default=str),
    }
    if result.is_error:
        block["is_error"] = True
    return block


def anthropic_messages(
    request: ModelRequest, rules: FileRules | None = None
) -> list[dict[str, Any]]:
    """The request's conversation as alternating Messages API turns of content blocks."""
    if rules is None:
        window = context_window_for(request.model, default=DEFAULT_ANTHROPIC_WINDOW)
        rules = file_rules(request.model, window)
    turns: list[dict[str, Any]] = []
    known_calls: set[str] = set()

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": list(blocks)})

    for message in request.messages:
        if isinstance(message, UserTurn):
            add("user", _user_blocks(message.content, rules))
        elif isinstance(message, AssistantTurn):
            blocks = [_text_block(message.text)] if message.text else []
            for call in message.tool_calls:
                blocks.append(
                    {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
                )
                known_calls.add(call.id)
            add("assistant", blocks)
        elif isinstance(message, ToolResult):
            if message.tool_call_id in known_calls:
                add("user", [_result_block(message)])
            else:  # its call is not in the transcript (e.g. compacted away): show it as text
                label = f"[result of tool call {message.tool_call_id} ({message.name})]"
                add("user", [_text_block(f"{label} {result_text(message)}")])
        else:
            add("user", [_text_block(note_text(message))])

    for turn in turns:
        if turn["role"] == "user":
            # The API wants tool results before any other block of their user turn.
            blocks = turn["content"]
            turn["content"] = [b for b in blocks if b.get("type") == "tool_result"] + [
                b for b in blocks if b.get("type") != "tool_result"
            ]
    if turns and turns[-1]["role"] == "assistant":
        _trim_final_assistant(turns)
    if turns and turns[0]["role"] == "assistant":
        turns.insert(0, {"role": "user", "content": [_text_block("(conversation continues)")]})
    return turns


def _trim_final_assistant(turns: list[dict[str, Any]]) -> None:
    # A final assistant turn is a prefill, which the API refuses when it ends in whitespace.
    blocks = turns[-1]["content"]
    if blocks and blocks[-1].get("type") == "text":
        text = str(blocks[-1]["text"]).rstrip()
        if text:
            blocks[-1] = _text_block(text)
        else:
            blocks.pop()
    if not blocks:
        turns.pop()


# --- response -----------------------------------------------------------------------------------


@dataclass
class _Block:
    type: str
    id: str = ""
    name: str = ""
    input: Any = None
    json_parts: list[str] = field(default_factory=list)
    stopped: bool = False


@dataclass
class _Reply:
    blocks: dict[int, _Block] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    stop_reason: str | None = None
    ended: bool = False  # ``message_stop`` came

    def take_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.usage.update({k: int(v) for k, v in usage.items() if isinstance(v, int)})

    def tool_calls(self) -> list[ToolCall]:
        calls = []
        for _, block in sorted(self.blocks.items()):
            if block.type != "tool_use" or not block.stopped:
                continue
            raw = "".join(block.json_parts)
            if raw:
                arguments = decode_tool_arguments(raw)
            else:
                arguments = block.input if isinstance(block.input, dict) else {}
            call_id = block.id or f"call_{uuid.uuid4().hex}"
            calls.append(ToolCall(id=call_id, name=block.name, arguments=arguments))
        return calls

    def finished(self) -> Finished:
        u = self.usage
        usage = {
            # The whole prompt, cached or not, is what fills the context window.
            "input_tokens": u.get("input_tokens", 0)
            + u.get("cache_creation_input_tokens", 0)
            + u.get("cache_read_input_tokens", 0),
            "output_tokens": u.get("output_tokens", 0),
        }
        for key in ("cache_creation_input_tokens", "cache_read_input_tokens"):
            if u.get(key):
                usage[key] = u[key]
        reason = _STOP_REASONS.get(self.stop_reason or "", "stop")
        if reason == "stop" and any(b.type == "tool_use" for b in self.blocks.values()):
            reason = "tool_use"
        return Finished(stop_reason=reason, usage=usage if u else None)

    def feed(self, event: SSEEvent) -> str:
        """Take one event in; return its text delta ("" if none)."""
        payload = event.json()
        return self._take(str(payload.get("type") or event.event), payload)

    def _take(self, kind: str, payload: dict[str, Any]) -> str:
        if kind == "message_start":
            self.take_usage((payload.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            start = payload.get("content_block") or {}
            self.blocks[int(payload.get("index", 0))] = _Block(
                type=str(start.get("type", "")),
                id=str(start.get("id", "")),
                name=str(start.get("name", "")),
                input=start.get("input"),
            )
        elif kind == "content_block_delta":
            block = self.blocks.setdefault(int(payload.get("index", 0)), _Block(type="text"))
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta":
                return str(delta.get("text", ""))
            if delta.get("type") == "input_json_delta":
                block.json_parts.append(str(delta.get("partial_json", "")))
        elif kind == "content_block_stop":
            stopped = self.blocks.get(int(payload.get("index", 0)))
            if stopped is not None:
                stopped.stopped = True
        elif kind == "message_delta":
            reason = (payload.get("delta") or {}).get("stop_reason")
            if reason:
                self.stop_reason = str(reason)
            self.take_usage(payload.get("usage"))
        elif kind == "message_stop":
            self.ended = True
        elif kind == "error":
            raise _stream_error(payload)
        return ""  # ping, and event types added after this client was written

    @property
    def complete(self) -> bool:
        return self.ended or self.stop_reason is not None


# --- the provider -------------------------------------------------------------------------------


class AnthropicProvider(HTTPProvider):
    """Claude models through the Anthropic Messages API.

    ``base_url`` and ``api_key`` default to ``ANTHROPIC_BASE_URL`` (else the public API) and
    ``ANTHROPIC_API_KEY``, read when a request is made. ``max_tokens`` is the output limit sent
    with every request unless the agent's model options give one.
    """

    name = "anthropic"
    base_url_env = "ANTHROPIC_BASE_URL"
    api_key_env = "ANTHROPIC_API_KEY"
    default_base_url = DEFAULT_BASE_URL
    default_window = DEFAULT_ANTHROPIC_WINDOW
    stream_path = "/v1/messages"
    malformed_event = "anthropic: malformed stream event"
    incomplete_stream = "anthropic: the stream ended before the message was complete"

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        context_windows: Mapping[str, int] | None = None,
        max_tokens: int = 4096,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        client: httpx2.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key,
            context_windows=context_windows,
            timeout=timeout,
            connect_timeout=connect_timeout,
            headers=headers,
            client=client,
        )
        self.max_tokens = max_tokens

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (``request.options`` are passed through)."""
        system = system_prompt(request)
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            **request.options,
            "model": request.model,
            "messages": anthropic_messages(
                request, file_rules(request.model, self.context_window(request.model))
            ),
            "stream": True,
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
        return body

    def request_headers(self) -> dict[str, str]:
        headers = {"accept": "text/event-stream", "anthropic-version": API_VERSION, **self._headers}
        key = self.api_key
        if key:
            headers["x-api-key"] = key
        elif self.base_url == DEFAULT_BASE_URL:
            raise ProviderError("anthropic: ANTHROPIC_API_KEY is not set")
        return headers

    def new_answer(self) -> _Reply:
        return _Reply()

    def error_response(self, status: int, body: str, headers: httpx2.Headers) -> ProviderError:
        return _error_response(status, body, headers)


def _classify(
    status: int | None, message: str, kind: str | None, retry_after: float | None = None
) -> ProviderError:
    transient: bool | None = None
    if kind in _TRANSIENT_TYPES:
        transient = True
    elif kind is not None and status is None:
        transient = False  # a named error type that is not a server-side hiccup
    return classify_failure(
        "anthropic", status, message, hints=(kind,), transient=transient, retry_after=retry_after
    )


def _error_response(status: int, body: str, headers: httpx2.Headers) -> ProviderError:
    message, kind, _ = error_details(body)
    if message is None:
        message = body.strip()[:500] or "no error message"
    if status < 400:
        if kind is None:
            return ProviderError(f"anthropic: expected a streamed response, got: {message}")
        return _classify(None, message, kind)
    return _classify(status, message, kind, retry_after_seconds(headers))


def _stream_error(payload: dict[str, Any]) -> ProviderError:
    message, kind, _ = error_details(json.dumps(payload))
    return _classify(None, message or "unknown error", kind)
