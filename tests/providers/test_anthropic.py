"""The Anthropic client against a real local HTTP server speaking Messages-API SSE."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from hearth.errors import ProviderError
from hearth.providers import AnthropicProvider
from hearth.providers.base import (
    AssistantTurn,
    Finished,
    ModelRequest,
    SystemNote,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    UserTurn,
)

pytestmark = pytest.mark.anyio


def ev(name: str, payload: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **payload})}\n\n"


def start(input_tokens: int = 10, **usage: int) -> str:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-test",
        "stop_reason": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, **usage},
    }
    return ev("message_start", {"message": message})


def text_block(index: int) -> str:
    block = {"type": "text", "text": ""}
    return ev("content_block_start", {"index": index, "content_block": block})


def text(index: int, t: str) -> str:
    return ev("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": t}})


def tool_block(index: int, id: str, name: str) -> str:
    block = {"type": "tool_use", "id": id, "name": name, "input": {}}
    return ev("content_block_start", {"index": index, "content_block": block})


def args(index: int, part: str) -> str:
    delta = {"type": "input_json_delta", "partial_json": part}
    return ev("content_block_delta", {"index": index, "delta": delta})


def stop_block(index: int) -> str:
    return ev("content_block_stop", {"index": index})


def finish(reason: str, output_tokens: int) -> str:
    return ev(
        "message_delta",
        {
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
    )


STOP = ev("message_stop", {})
PING = ev("ping", {})


def failure(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


@pytest.fixture
async def provider(server: Any) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(server.url, "sk-ant-test", timeout=2.0, connect_timeout=2.0)
    yield p
    await p.aclose()


# --- streaming ----------------------------------------------------------------------------------


async def test_plain_reply_streams_text_deltas_then_finished_with_usage(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            start(25),
            text_block(0),
            PING,
            text(0, "Hel"),
            text(0, "lo"),
            text(0, " there"),
            stop_block(0),
            finish("end_turn", 7),
            STOP,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" there"),
        Finished(stop_reason="stop", usage={"input_tokens": 25, "output_tokens": 7}),
    ]
    sent = server.requests[0]
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    body = sent.json()
    assert body["stream"] is True
    assert body["max_tokens"] == 4096
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]


async def test_tool_input_split_across_deltas_becomes_one_call(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            start(),
            text_block(0),
            text(0, "Checking."),
            stop_block(0),
            tool_block(1, "toolu_01", "get_weather"),
            args(1, ""),
            args(1, '{"ci'),
            args(1, 'ty": "Os'),
            args(1, 'lo"}'),
            stop_block(1),
            finish("tool_use", 40),
            STOP,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events == [
        TextDelta("Checking."),
        ToolCallEvent(ToolCall("toolu_01", "get_weather", {"city": "Oslo"})),
        Finished(stop_reason="tool_use", usage={"input_tokens": 10, "output_tokens": 40}),
    ]


async def test_two_parallel_tool_calls_are_reported_once_each_in_order(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            start(),
            tool_block(0, "toolu_A", "get_weather"),
            args(0, '{"city": "Oslo"}'),
            stop_block(0),
            tool_block(1, "toolu_B", "get_time"),
            args(1, '{"tz":'),
            args(1, ' "UTC"}'),
            stop_block(1),
            tool_block(2, "toolu_C", "no_args"),
            stop_block(2),
            finish("tool_use", 50),
            STOP,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events[:3] == [
        ToolCallEvent(ToolCall("toolu_A", "get_weather", {"city": "Oslo"})),
        ToolCallEvent(ToolCall("toolu_B", "get_time", {"tz": "UTC"})),
        ToolCallEvent(ToolCall("toolu_C", "no_args", {})),
    ]
    assert events[3] == Finished("tool_use", {"input_tokens": 10, "output_tokens": 50})


async def test_max_tokens_maps_to_length_and_cached_input_counts_as_input(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            start(5, cache_read_input_tokens=100),
            text_block(0),
            text(0, "a"),
            stop_block(0),
            finish("max_tokens", 4096),
            STOP,
        ]
    )
    events, _ = await collect(provider, hello)
    assert events[-1] == Finished(
        "length",
        {"input_tokens": 105, "output_tokens": 4096, "cache_read_input_tokens": 100},
    )


async def test_thinking_blocks_and_unknown_events_are_ignored(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    thinking = {"type": "thinking", "thinking": ""}
    server.sse(
        [
            start(),
            ev("content_block_start", {"index": 0, "content_block": thinking}),
            ev(
                "content_block_delta",
                {"index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
            ),
            stop_block(0),
            ev("some_future_event", {"x": 1}),
            text_block(1),
            text(1, "Answer."),
            stop_block(1),
            finish("end_turn", 9),
            STOP,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events[0] == TextDelta("Answer.") and events[1].stop_reason == "stop"


# --- the request --------------------------------------------------------------------------------


async def test_request_maps_the_whole_conversation(
    server: Any, provider: AnthropicProvider, collect: Any, conversation: ModelRequest
) -> None:
    server.sse([start(), text_block(0), text(0, "ok"), stop_block(0), finish("end_turn", 1), STOP])
    await collect(provider, conversation)
    body = server.requests[0].json()
    assert body["system"] == (
        "You are helpful.\n\nSummary of the earlier conversation: The user lives in Oslo."
    )
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "Look the weather up.",
            "input_schema": conversation.tools[0].parameters,
        }
    ]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "What's the weather in Oslo and Bergen?"}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "call_A1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_B2",
                    "name": "get_weather",
                    "input": {"city": "Bergen"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_A1", "content": '{"temp_c": 4}'},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_B2",
                    "content": '{"type": "interrupted", '
                    '"message": "the call was cut off; outcome unknown"}',
                    "is_error": True,
                },
                {
                    "type": "text",
                    "text": "[runtime note: submission_interrupted] The previous attempt crashed.",
                },
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]


def test_tool_results_come_first_in_their_user_turn_and_turns_alternate() -> None:
    request = ModelRequest(
        model="claude-x",
        system="",
        options={"max_tokens": 100, "temperature": 0},
        messages=(
            UserTurn("go"),
            UserTurn("quickly"),
            AssistantTurn("", (ToolCall("t1", "f", {"a": 1}),)),
            SystemNote("signal", "user pressed stop"),
            ToolResult("t1", "f", "done"),
            ToolResult("gone", "g", {"x": 1}),  # its call was compacted away
            AssistantTurn("Partial answer   ", aborted=True),
        ),
    )
    body = AnthropicProvider("http://x", "k").request_body(request)
    assert "system" not in body and "tools" not in body
    assert (body["max_tokens"], body["temperature"]) == (100, 0)
    assert body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "go"}, {"type": "text", "text": "quickly"}],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "done"},
                {"type": "text", "text": "[runtime note: signal] user pressed stop"},
                {"type": "text", "text": '[result of tool call gone (g)] {"x": 1}'},
            ],
        },
        # a final assistant turn is a prefill: no trailing whitespace allowed
        {"role": "assistant", "content": [{"type": "text", "text": "Partial answer"}]},
    ]


# --- errors -------------------------------------------------------------------------------------


async def test_429_is_transient_with_retry_after(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.error(
        429,
        failure("rate_limit_error", "Number of requests has exceeded your limit"),
        headers={"retry-after": "2"},
    )
    events, error = await collect(provider, hello)
    assert events == []
    assert (error.kind, error.status, error.retry_after) == ("transient", 429, 2.0)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "kind"),
    [(500, "api_error"), (502, "api_error"), (503, "api_error"), (529, "overloaded_error")],
)
async def test_server_errors_and_overload_are_transient(
    server: Any,
    provider: AnthropicProvider,
    collect: Any,
    hello: ModelRequest,
    status: int,
    kind: str,
) -> None:
    server.error(status, failure(kind, "Overloaded"))
    _, error = await collect(provider, hello)
    assert (error.kind, error.status) == ("transient", status)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "kind", "message"),
    [
        (401, "authentication_error", "invalid x-api-key"),
        (403, "permission_error", "Your API key does not have permission to use this resource."),
        (400, "invalid_request_error", "messages: roles must alternate"),
    ],
)
async def test_client_errors_are_terminal_with_the_providers_message(
    server: Any,
    provider: AnthropicProvider,
    collect: Any,
    hello: ModelRequest,
    status: int,
    kind: str,
    message: str,
) -> None:
    server.error(status, failure(kind, message))
    _, error = await collect(provider, hello)
    assert (error.kind, error.status) == ("terminal", status)
    assert message in str(error)


async def test_prompt_too_long_is_overflow(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.error(
        400, failure("invalid_request_error", "prompt is too long: 212000 tokens > 200000 maximum")
    )
    _, error = await collect(provider, hello)
    assert (error.kind, error.status) == ("overflow", 400)


async def test_an_overloaded_error_event_mid_stream_is_transient_after_the_partial(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            start(),
            text_block(0),
            text(0, "Part"),
            text(0, "ial"),
            ev("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ]
    )
    events, error = await collect(provider, hello)
    assert events == [TextDelta("Part"), TextDelta("ial")]
    assert error.kind == "transient" and "Overloaded" in error.message


async def test_an_invalid_request_error_event_mid_stream_is_terminal(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            start(),
            ev("error", {"error": {"type": "invalid_request_error", "message": "bad tool schema"}}),
        ]
    )
    _, error = await collect(provider, hello)
    assert error.kind == "terminal"


async def test_connection_refused_is_transient(
    free_port: int, collect: Any, hello: ModelRequest
) -> None:
    provider = AnthropicProvider(f"http://127.0.0.1:{free_port}", "k", connect_timeout=2.0)
    _, error = await collect(provider, hello)
    await provider.aclose()
    assert error.kind == "transient"


async def test_a_stream_cut_mid_way_yields_the_partial_then_a_transient_error(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse([start(), text_block(0), text(0, "The answer "), text(0, "is")], end="drop")
    events, error = await collect(provider, hello)
    assert events == [TextDelta("The answer "), TextDelta("is")]
    assert isinstance(error, ProviderError) and error.kind == "transient"


async def test_a_cut_inside_a_tool_call_reports_no_call(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse([start(), tool_block(0, "toolu_X", "f"), args(0, '{"a": ')], end="drop")
    events, error = await collect(provider, hello)
    assert events == [] and error.kind == "transient"


async def test_losing_only_message_stop_keeps_the_reply(
    server: Any, provider: AnthropicProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [start(), text_block(0), text(0, "whole"), stop_block(0), finish("end_turn", 2)], end="drop"
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events == [
        TextDelta("whole"),
        Finished("stop", {"input_tokens": 10, "output_tokens": 2}),
    ]


async def test_a_read_timeout_mid_stream_is_transient(
    server: Any, collect: Any, hello: ModelRequest
) -> None:
    provider = AnthropicProvider(server.url, "k", timeout=0.3)
    server.sse([start(), text_block(0), text(0, "slow")], end="hang")
    with anyio.fail_after(5):
        events, error = await collect(provider, hello)
    await provider.aclose()
    assert events == [TextDelta("slow")]
    assert error.kind == "transient" and "timed out" in error.message


# --- cancellation -------------------------------------------------------------------------------


async def test_breaking_out_of_the_stream_closes_the_connection_at_once(
    server: Any, provider: AnthropicProvider, hello: ModelRequest
) -> None:
    server.sse([start(), text_block(0), text(0, "one"), text(0, "two")], end="hang")
    async with contextlib.aclosing(provider.stream(hello)) as stream:  # type: ignore[type-var]
        async for event in stream:
            assert event == TextDelta("one")
            break
    assert await server.wait_disconnect(timeout=1.0) < 1.0


async def test_cancelling_the_consumer_closes_the_connection_at_once(
    server: Any, provider: AnthropicProvider, hello: ModelRequest
) -> None:
    server.sse([start(), text_block(0), text(0, "one")], end="hang")
    seen: list[Any] = []
    first = anyio.Event()

    async def consume() -> None:
        async for event in provider.stream(hello):
            seen.append(event)
            first.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        with anyio.fail_after(2):
            await first.wait()
        tg.cancel_scope.cancel()
    assert await server.wait_disconnect(timeout=1.0) < 1.0


# --- configuration ------------------------------------------------------------------------------


async def test_base_url_and_key_come_from_the_environment(
    server: Any, collect: Any, hello: ModelRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"{server.url}/proxy/")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    provider = AnthropicProvider()
    server.sse([start(), text_block(0), text(0, "hi"), stop_block(0), finish("end_turn", 1), STOP])
    _, error = await collect(provider, hello)
    await provider.aclose()
    assert error is None
    sent = server.requests[0]
    assert sent.path == "/proxy/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-env"
    assert "authorization" not in sent.headers


async def test_the_public_api_without_a_key_fails_terminally_without_a_request(
    collect: Any, hello: ModelRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    _, error = await collect(AnthropicProvider(), hello)
    assert error.kind == "terminal" and "ANTHROPIC_API_KEY" in error.message


def test_context_windows_default_to_200k_and_can_be_overridden() -> None:
    provider = AnthropicProvider(context_windows={"claude-sonnet-4-5": 1_000_000})
    assert provider.context_window("claude-3-5-haiku-20241022") == 200_000
    assert provider.context_window("claude-sonnet-4-5-20250929") == 1_000_000
    assert provider.context_window("claude-next-gen") == 200_000
