"""The OpenAI Chat Completions client: OpenAI itself and every server that speaks its dialect.

Ollama, vLLM, llama.cpp's server, LM Studio and OpenRouter all serve ``POST /chat/completions``
with streamed chunks; point ``OPENAI_BASE_URL`` at them. The client never retries: a failure
comes out as a classified ``ProviderError`` and the runtime's durable budget decides.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx2

from hearth.errors import ProviderError
from hearth.providers.base import (
    AssistantTurn,
    Finished,
    Message,
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
from hearth.providers.windows import DEFAULT_OPENAI_WINDOW, context_window_for, takes_images
from hearth.sse import SSEEvent

__all__ = ["OpenAIProvider"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_STOP_REASONS = {
    "stop": "stop",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "length",
}


# --- request ------------------------------------------------------------------------------------


def _user_parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [p if isinstance(p, dict) else {"type": "text", "text": str(p)} for p in content]
    return [{"type": "text", "text": json.dumps(content, default=str)}]


def _wire_part(block: Block) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    return {"type": "image_url", "image_url": {"url": block.data_url()}}


def _join_user(parts: list[Any]) -> Any:
    """Plain text when every part is text (what local servers handle best), else the parts."""
    if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        return "\n\n".join(str(p.get("text", "")) for p in parts)
    return parts


class _Transcript:
    """Builds the ``messages`` array, keeping the rules strict chat templates enforce.

    Consecutive user-side content becomes one user message; tool messages stay right after the
    assistant message that made the calls (a note that arrives in between waits until the results
    are in); a result whose call is not in the transcript is shown as user-side text.
    """

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._user: list[Any] = []  # user-side parts not yet flushed
        self._pending: set[str] = set()  # calls of the last assistant message still unanswered
        self._known: set[str] = set()

    def user(self, parts: list[Any]) -> None:
        self._user.extend(parts)

    def assistant(self, turn: AssistantTurn) -> None:
        if not turn.text and not turn.tool_calls:
            return
        self._flush(force=True)
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in turn.tool_calls
        ]
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and not self._pending:
            # Two assistant turns in a row (e.g. a continuation): one message.
            last["content"] = ((last.get("content") or "") + turn.text) or None
            if calls:
                last["tool_calls"] = [*last.get("tool_calls", []), *calls]
        else:
            message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
            if calls:
                message["tool_calls"] = calls
            self.messages.append(message)
        self._pending = {c.id for c in turn.tool_calls}
        self._known.update(self._pending)

    def tool_result(self, result: ToolResult) -> None:
        if result.tool_call_id not in self._known:
            self._user.append(
                {
                    "type": "text",
                    "text": f"[result of tool call {result.tool_call_id} "
                    f"({result.name})] {result_text(result)}",
                }
            )
            return
        if result.tool_call_id not in self._pending:
            self._flush(force=True)  # a late result: never leave it behind queued user text
        self.messages.append(
            {"role": "tool", "tool_call_id": result.tool_call_id, "content": result_text(result)}
        )
        self._pending.discard(result.tool_call_id)
        self._flush()

    def _flush(self, *, force: bool = False) -> None:
        if not self._user or (self._pending and not force):
            return
        self._pending = set()
        content = _join_user(self._user)
        self._user = []
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "user":
            merged = _user_parts(last["content"]) + _user_parts(content)
            last["content"] = _join_user(merged)
        else:
            self.messages.append({"role": "user", "content": content})

    def finish(self) -> list[dict[str, Any]]:
        self._flush(force=True)
        return self.messages


def file_rules(model: str, window: int) -> FileRules:
    """What an OpenAI-compatible model takes: images by the model table (as ``image_url`` data
    URLs), no documents, and text files up to a quarter of its window (in characters ≈ tokens)."""
    return FileRules(images=takes_images(model, default=False), text_limit=max(window, 1000))


def chat_messages(request: ModelRequest, rules: FileRules | None = None) -> list[dict[str, Any]]:
    """The request's conversation as Chat Completions ``messages``."""
    if rules is None:
        window = context_window_for(request.model, default=DEFAULT_OPENAI_WINDOW)
        rules = file_rules(request.model, window)
    transcript = _Transcript()
    for message in request.messages:
        _add(transcript, message, rules)
    messages = transcript.finish()
    if messages and messages[0]["role"] == "assistant":
        # Many chat templates require the first non-system message to be the user's.
        messages.insert(0, {"role": "user", "content": "(conversation continues)"})
    system = system_prompt(request)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _add(transcript: _Transcript, message: Message, rules: FileRules) -> None:
    if isinstance(message, UserTurn):
        transcript.user([_wire_part(b) for b in user_blocks(message.content, rules)])
    elif isinstance(message, AssistantTurn):
        transcript.assistant(message)
    elif isinstance(message, ToolResult):
        transcript.tool_result(message)
    else:
        transcript.user([{"type": "text", "text": note_text(message)}])


# --- response -----------------------------------------------------------------------------------


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _tokens(value: Any) -> int:
    """A token count from a usage report; 0 for what is not one (a server's usage is a report,
    not part of the answer: an odd one must not fail the turn)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return 0


def _text_of(content: Any) -> str:
    """A delta's text: a string, or a list of parts of which the ``text`` ones count (some
    servers stream content so, with ``thinking`` parts the answer leaves out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    return ""


@dataclass
class _Reply:
    """What the chunks of one streamed completion have said so far."""

    calls: dict[int, _PartialCall] = field(default_factory=dict)  # in the order they began
    _at: dict[int, int] = field(default_factory=dict)  # a chunk's index → the call it continues
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    ended: bool = False  # the ``[DONE]`` marker came

    def feed(self, event: SSEEvent) -> str:
        """Take one event in; return its text delta ("" if none)."""
        if event.is_done:
            self.ended = True
            return ""
        chunk = event.json()
        if chunk.get("error"):
            raise _stream_error(chunk)
        return self._take(chunk)

    def _take(self, chunk: dict[str, Any]) -> str:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = {
                "input_tokens": _tokens(usage.get("prompt_tokens")),
                "output_tokens": _tokens(usage.get("completion_tokens")),
            }
            details = usage.get("prompt_tokens_details")
            cached = _tokens(details.get("cached_tokens")) if isinstance(details, dict) else 0
            if cached:
                self.usage["cache_read_input_tokens"] = cached
        choices = chunk.get("choices") or []
        choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
        if choice is None:
            return ""
        delta = choice.get("delta") or {}
        for fragment in delta.get("tool_calls") or []:
            self._call_fragment(fragment)
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        return _text_of(delta.get("content"))

    def _call_fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        given = str(fragment["id"]) if fragment.get("id") else None
        key: int | None
        if isinstance(index, int) and not isinstance(index, bool):
            key = self._at.get(index)
            held = None if key is None else self.calls[key].id
            if held and given and held != given:
                # A new id at an index in use: Ollama sends each of several parallel calls
                # whole, every one at index 0. It is a call of its own.
                key = None
        else:
            # Some servers leave the index out: a new id starts a call, else it continues.
            known = {c.id for c in self.calls.values()}
            new = given is not None and given not in known
            key = None if new or not self.calls else len(self.calls) - 1
        if key is None:
            key = len(self.calls)  # calls keep the order they began in
            self.calls[key] = _PartialCall()
            if isinstance(index, int):
                self._at[index] = key
        call = self.calls[key]
        if fragment.get("id") and not call.id:
            call.id = str(fragment["id"])
        function = fragment.get("function") or {}
        if function.get("name") and not call.name:
            call.name = str(function["name"])
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif isinstance(arguments, dict):
            call.arguments.append(json.dumps(arguments))

    @property
    def complete(self) -> bool:
        return self.ended or self.finish_reason is not None

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(
                id=call.id or f"call_{uuid.uuid4().hex}",
                name=call.name,
                arguments=decode_tool_arguments("".join(call.arguments)),
            )
            for _, call in sorted(self.calls.items())
        ]

    def stop_reason(self) -> str:
        reason = _STOP_REASONS.get(self.finish_reason or "", "stop")
        # Some local servers say "stop" even when the reply is tool calls.
        return "tool_use" if self.calls and reason == "stop" else reason

    def finished(self) -> Finished:
        return Finished(stop_reason=self.stop_reason(), usage=self.usage)


# --- the provider -------------------------------------------------------------------------------


class OpenAIProvider(HTTPProvider):
    """Models behind an OpenAI-compatible ``/chat/completions`` endpoint.

    ``base_url`` and ``api_key`` default to ``OPENAI_BASE_URL`` (else the public API) and
    ``OPENAI_API_KEY``, read when a request is made; a key is optional for local servers.

    >>> provider = OpenAIProvider("http://127.0.0.1:11434/v1", context_windows={"*": 32768})
    """

    name = "openai"
    base_url_env = "OPENAI_BASE_URL"
    api_key_env = "OPENAI_API_KEY"
    default_base_url = DEFAULT_BASE_URL
    default_window = DEFAULT_OPENAI_WINDOW
    stream_path = "/chat/completions"
    malformed_event = "openai: malformed stream chunk"
    incomplete_stream = "openai: the stream ended before the response was complete"

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (``request.options`` are passed through)."""
        body: dict[str, Any] = {
            **request.options,
            "model": request.model,
            "messages": chat_messages(
                request, file_rules(request.model, self.context_window(request.model))
            ),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        return body

    def request_headers(self) -> dict[str, str]:
        headers = {"accept": "text/event-stream", **self._headers}
        key = self.api_key
        if key:
            headers["authorization"] = f"Bearer {key}"
        elif self.base_url == DEFAULT_BASE_URL:
            raise ProviderError(
                "openai: OPENAI_API_KEY is not set; set it, or set OPENAI_BASE_URL to a local "
                "OpenAI-compatible server"
            )
        return headers

    def new_answer(self) -> _Reply:
        return _Reply()

    def error_response(self, status: int, body: str, headers: httpx2.Headers) -> ProviderError:
        return _error_response(status, body, headers)


def _error_response(status: int, body: str, headers: httpx2.Headers) -> ProviderError:
    message, kind, code = error_details(body)
    if message is None:
        message = body.strip()[:500] or "no error message"
    if status < 400:
        # JSON where a stream was expected: an error sent with a 200, or "stream" was ignored.
        if kind is None and code is None and '"error"' not in body:
            return ProviderError(f"openai: expected a streamed response, got: {message}")
        return classify_failure("openai", None, message, hints=(kind, code))
    transient = False if code == "insufficient_quota" else None  # a 429 that waiting won't fix
    return classify_failure(
        "openai",
        status,
        message,
        hints=(kind, code),
        transient=transient,
        retry_after=retry_after_seconds(headers),
    )


def _stream_error(chunk: dict[str, Any]) -> ProviderError:
    message, kind, code = error_details(json.dumps(chunk))
    status = int(code) if code is not None and code.isascii() and code.isdigit() else None
    transient = None if status is None else status in (408, 429) or status >= 500
    return classify_failure(
        "openai", status, message or "unknown error", hints=(kind, code), transient=transient
    )
