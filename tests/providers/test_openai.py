"""The OpenAI-compatible client against a real local HTTP server speaking Chat Completions SSE."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from fakellm import Answer

from hearth.errors import ProviderError
from hearth.providers import OpenAIProvider, default_providers
from hearth.providers.base import (
    AssistantTurn,
    Finished,
    ModelProvider,
    ModelRequest,
    SystemNote,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    UserTurn,
)

pytestmark = pytest.mark.anyio

DONE = "data: [DONE]\n\n"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> str:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n"


def text(t: str) -> str:
    return chunk({"content": t})


def usage(prompt: int, completion: int) -> str:
    body = {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    return f"data: {json.dumps(body)}\n\n"


def call_part(index: int, *, id: str | None = None, name: str | None = None, args: str = "") -> str:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if id is not None:
        fragment["id"] = id
        fragment["type"] = "function"
    if name is not None:
        fragment["function"]["name"] = name
    return chunk({"tool_calls": [fragment]})


@pytest.fixture
async def provider(server: Any) -> AsyncIterator[OpenAIProvider]:
    p = OpenAIProvider(f"{server.url}/v1", "sk-test", timeout=2.0, connect_timeout=2.0)
    yield p
    await p.aclose()


def texts(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


# --- streaming ----------------------------------------------------------------------------------


async def test_plain_reply_streams_text_deltas_then_finished_with_usage(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            chunk({"role": "assistant", "content": ""}),
            text("Hel"),
            text("lo"),
            text(" there"),
            chunk(finish="stop"),
            usage(12, 3),
            DONE,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" there"),
        Finished(stop_reason="stop", usage={"input_tokens": 12, "output_tokens": 3}),
    ]
    sent = server.requests[0]
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    body = sent.json()
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["model"] == "m"


async def test_tool_call_arguments_split_across_chunks_become_one_call(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            call_part(0, id="call_abc", name="get_weather"),
            call_part(0, args='{"ci'),
            call_part(0, args='ty": "Os'),
            call_part(0, args='lo"}'),
            chunk(finish="tool_calls"),
            usage(20, 9),
            DONE,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events == [
        ToolCallEvent(ToolCall("call_abc", "get_weather", {"city": "Oslo"})),
        Finished(stop_reason="tool_use", usage={"input_tokens": 20, "output_tokens": 9}),
    ]


async def test_two_parallel_tool_calls_are_reported_once_each_in_index_order(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse(
        [
            text("Checking both."),
            call_part(0, id="call_1", name="get_weather", args='{"city":'),
            call_part(1, id="call_2", name="get_time", args='{"tz": "Europe/'),
            call_part(0, args=' "Oslo"}'),
            call_part(1, args='Oslo"}'),
            chunk(finish="tool_calls"),
            usage(30, 15),
            DONE,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events[0] == TextDelta("Checking both.")
    assert events[1:3] == [
        ToolCallEvent(ToolCall("call_1", "get_weather", {"city": "Oslo"})),
        ToolCallEvent(ToolCall("call_2", "get_time", {"tz": "Europe/Oslo"})),
    ]
    assert isinstance(events[3], Finished) and events[3].stop_reason == "tool_use"


async def test_whole_parallel_calls_all_at_index_0_stay_apart_by_their_ids(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    """Ollama sends each of several parallel calls whole, every one at index 0: they were
    merged into one call with the first id and both argument texts run together."""
    server.sse(
        [
            call_part(0, id="call_a", name="write", args='{"path": "hello.py"}'),
            call_part(0, id="call_b", name="write", args='{"path": "world.py"}'),
            call_part(0, args=""),  # a fragment without id continues the latest call there
            chunk(finish="tool_calls"),
            DONE,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events[:2] == [
        ToolCallEvent(ToolCall("call_a", "write", {"path": "hello.py"})),
        ToolCallEvent(ToolCall("call_b", "write", {"path": "world.py"})),
    ]
    assert events[2] == Finished(stop_reason="tool_use", usage=None)


async def test_content_streamed_as_a_list_of_parts_keeps_its_text(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    """Some servers stream ``content`` as parts (text, thinking): the reply was dropped."""
    parts = [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Paris."}]
    server.sse([chunk({"content": parts}), chunk(finish="stop"), DONE])
    events, error = await collect(provider, hello)
    assert error is None
    assert events == [TextDelta("Paris."), Finished(stop_reason="stop", usage=None)]


async def test_a_call_without_id_gets_one_and_bad_json_arguments_are_kept_raw(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse([call_part(0, name="f", args='{"a": 1'), chunk(finish="stop"), DONE])
    events, error = await collect(provider, hello)
    assert error is None
    call = events[0].call
    assert call.id.startswith("call_") and len(call.id) == len("call_") + 32
    assert call.arguments == {"_raw": '{"a": 1'}
    # A server that says "stop" with tool calls still means tool use.
    assert events[1] == Finished(stop_reason="tool_use", usage=None)


@pytest.mark.parametrize("raw", ['{"x": NaN}', '{"x": -Infinity}', '{"x": 1e999}'])
async def test_arguments_with_numbers_that_have_no_json_form_are_kept_raw(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest, raw: str
) -> None:
    """Python's reader takes NaN and overflowing numbers; stored, they would make the stream
    unreadable to every strict reader. They are kept raw, as any other bad arguments are."""
    server.sse([call_part(0, name="f", args=raw), chunk(finish="tool_calls"), DONE])
    events, error = await collect(provider, hello)
    assert error is None
    assert events[0].call.arguments == {"_raw": raw}


async def test_length_finish_reason_maps_to_length(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse([text("a"), chunk(finish="length"), usage(1, 1), DONE])
    events, _ = await collect(provider, hello)
    assert events[-1] == Finished("length", {"input_tokens": 1, "output_tokens": 1})


# --- the request --------------------------------------------------------------------------------


async def test_request_maps_the_whole_conversation(
    server: Any, provider: OpenAIProvider, collect: Any, conversation: ModelRequest
) -> None:
    server.sse([text("ok"), chunk(finish="stop"), DONE])
    await collect(provider, conversation)
    body = server.requests[0].json()
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Look the weather up.",
                "parameters": conversation.tools[0].parameters,
            },
        }
    ]
    assert body["messages"] == [
        {
            "role": "system",
            "content": "You are helpful.\n\n"
            "Summary of the earlier conversation: The user lives in Oslo.",
        },
        {"role": "user", "content": "What's the weather in Oslo and Bergen?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_A1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "toolu_B2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_A1", "content": '{"temp_c": 4}'},
        {
            "role": "tool",
            "tool_call_id": "toolu_B2",
            "content": 'error: {"type": "interrupted", '
            '"message": "the call was cut off; outcome unknown"}',
        },
        {
            "role": "user",
            "content": "[runtime note: submission_interrupted] The previous attempt crashed."
            "\n\nAnd tomorrow?",
        },
    ]


def test_a_note_between_calls_and_results_waits_until_the_results_are_in() -> None:
    request = ModelRequest(
        model="m",
        system="",
        messages=(
            UserTurn("go"),
            AssistantTurn("", (ToolCall("c1", "f", {}),)),
            SystemNote("stream_interrupted", "cut"),
            ToolResult("c1", "f", "done"),
        ),
    )
    messages = OpenAIProvider("http://x").request_body(request)["messages"]
    assert messages == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "user", "content": "[runtime note: stream_interrupted] cut"},
    ]


def test_an_aborted_partial_is_sent_as_the_assistant_text_followed_by_the_note() -> None:
    request = ModelRequest(
        model="m",
        system="s",
        options={"temperature": 0.2},
        messages=(
            UserTurn("write a poem"),
            AssistantTurn("Roses are", aborted=True),
            SystemNote("stream_interrupted", "Your previous response was cut off."),
        ),
    )
    body = OpenAIProvider("http://x").request_body(request)
    assert body["temperature"] == 0.2
    assert "tools" not in body
    assert body["messages"][1:] == [
        {"role": "user", "content": "write a poem"},
        {"role": "assistant", "content": "Roses are"},
        {
            "role": "user",
            "content": "[runtime note: stream_interrupted] Your previous response was cut off.",
        },
    ]


# --- errors -------------------------------------------------------------------------------------


async def test_429_is_transient_with_retry_after(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.error(
        429,
        {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}},
        headers={"retry-after": "2"},
    )
    events, error = await collect(provider, hello)
    assert events == []
    assert (error.kind, error.status, error.retry_after) == ("transient", 429, 2.0)
    assert "Rate limit reached" in error.message
    assert len(server.requests) == 1  # the provider never retries on its own


async def test_429_for_an_exhausted_quota_is_terminal(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.error(
        429, {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
    )
    _, error = await collect(provider, hello)
    assert error.kind == "terminal"


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_server_errors_are_transient(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest, status: int
) -> None:
    server.error(status, {"error": {"message": "The server had an error", "type": "server_error"}})
    _, error = await collect(provider, hello)
    assert (error.kind, error.status) == ("transient", status)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (401, "Incorrect API key provided: the key you sent."),
        (403, "Project does not have access to model m"),
        (400, "Invalid value for 'messages[1].role'"),
        (404, "The model `m` does not exist"),
    ],
)
async def test_client_errors_are_terminal_with_the_providers_message(
    server: Any,
    provider: OpenAIProvider,
    collect: Any,
    hello: ModelRequest,
    status: int,
    message: str,
) -> None:
    server.error(status, {"error": {"message": message, "type": "invalid_request_error"}})
    _, error = await collect(provider, hello)
    assert (error.kind, error.status, error.retry_after) == ("terminal", status, None)
    assert message in str(error)


@pytest.mark.parametrize(
    ("status", "headers", "says"),
    [
        (307, {"location": "https://api.example.test/v1/chat/completions"}, "a redirect to https"),
        (301, {}, "answered HTTP 301 with nothing"),
        (204, {}, "answered HTTP 204 with nothing"),
    ],
)
async def test_a_redirect_or_no_content_is_a_terminal_error_naming_the_base_url(
    server: Any,
    provider: OpenAIProvider,
    collect: Any,
    hello: ModelRequest,
    status: int,
    headers: dict[str, str],
    says: str,
) -> None:
    """Read as an empty stream, each was "the stream ended early": transient, retried until the
    budget ran out, for a base URL that can never answer."""
    server.answers.append(Answer(status=status, headers=headers))
    _, error = await collect(provider, hello)
    assert (error.kind, error.status) == ("terminal", status)
    assert says in str(error) and "base URL" in str(error)
    assert len(server.requests) == 1


async def test_an_error_that_quotes_the_key_has_it_redacted(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    assert provider.api_key == "sk-test"
    server.error(401, {"error": {"message": "Incorrect API key provided: sk-test."}})
    _, error = await collect(provider, hello)
    assert "sk-test" not in str(error)
    assert "Incorrect API key provided: [redacted]." in str(error)


async def test_a_plain_string_error_body_is_used_as_the_message(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.error(404, {"error": "model 'llama9' not found, try pulling it first"})
    _, error = await collect(provider, hello)
    assert error.kind == "terminal"
    assert "model 'llama9' not found" in error.message


@pytest.mark.parametrize(
    "payload",
    [
        {
            "error": {
                "message": "This model's maximum context length is 128000 tokens. However, "
                "your messages resulted in 130000 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
        # vLLM words it the same way, without a code
        {
            "object": "error",
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "BadRequestError",
            "code": 400,
        },
        # llama.cpp's server
        {
            "error": {
                "code": 400,
                "type": "exceed_context_size_error",
                "message": "the request exceeds the available context size, try increasing it",
            }
        },
    ],
)
async def test_context_overflow_is_reported_as_overflow(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest, payload: Any
) -> None:
    server.error(400, payload)
    _, error = await collect(provider, hello)
    assert (error.kind, error.status) == ("overflow", 400)


async def test_connection_refused_is_transient(
    free_port: int, collect: Any, hello: ModelRequest
) -> None:
    provider = OpenAIProvider(f"http://127.0.0.1:{free_port}/v1", connect_timeout=2.0)
    _, error = await collect(provider, hello)
    await provider.aclose()
    assert error.kind == "transient"
    assert "could not connect" in error.message


async def test_a_stream_cut_mid_way_yields_the_partial_then_a_transient_error(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse([text("The answer "), text("is"), text(" forty")], end="drop")
    events, error = await collect(provider, hello)
    assert events == [TextDelta("The answer "), TextDelta("is"), TextDelta(" forty")]
    assert isinstance(error, ProviderError) and error.kind == "transient"


async def test_a_stream_that_ends_cleanly_without_a_finish_is_transient(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse([text("half")])
    events, error = await collect(provider, hello)
    assert events == [TextDelta("half")]
    assert error.kind == "transient"
    assert "before the response was complete" in error.message


async def test_losing_only_the_trailing_usage_keeps_the_reply(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    server.sse([text("whole"), chunk(finish="stop")], end="drop")
    events, error = await collect(provider, hello)
    assert error is None
    assert events == [TextDelta("whole"), Finished("stop", None)]


@pytest.mark.parametrize(
    ("reported", "kept"),
    [
        (
            '{"prompt_tokens": 1e999, "completion_tokens": 3}',
            {"input_tokens": 0, "output_tokens": 3},
        ),
        (
            '{"prompt_tokens": "12", "completion_tokens": [3]}',
            {"input_tokens": 0, "output_tokens": 0},
        ),
        (
            '{"prompt_tokens": 12.0, "prompt_tokens_details": [5]}',
            {"input_tokens": 12, "output_tokens": 0},
        ),
        (
            '{"prompt_tokens": 7, "completion_tokens": 2,'
            ' "prompt_tokens_details": {"cached_tokens": 4}}',
            {"input_tokens": 7, "output_tokens": 2, "cache_read_input_tokens": 4},
        ),
    ],
)
async def test_an_odd_usage_report_is_read_as_zero_and_keeps_the_reply(
    server: Any,
    provider: OpenAIProvider,
    collect: Any,
    hello: ModelRequest,
    reported: str,
    kept: dict[str, int],
) -> None:
    """A usage report is not part of the answer: counts that are not counts (an overflowing
    number, text, a list) read as 0, and the rest of the report is kept. Before, the first
    raised OverflowError out of the provider (the attempt crashed and the model was asked
    again) and text lost the whole report."""
    server.sse(
        [
            text("whole"),
            chunk(finish="stop"),
            f'data: {{"choices": [], "usage": {reported}}}\n\n',
            DONE,
        ]
    )
    events, error = await collect(provider, hello)
    assert error is None
    assert events == [TextDelta("whole"), Finished("stop", kept)]


async def test_an_error_event_mid_stream_is_transient_after_the_partial(
    server: Any, provider: OpenAIProvider, collect: Any, hello: ModelRequest
) -> None:
    error_chunk = {
        "error": {"message": "The server had an error while processing", "type": "server_error"}
    }
    server.sse([text("par"), f"data: {json.dumps(error_chunk)}\n\n"])
    events, error = await collect(provider, hello)
    assert events == [TextDelta("par")]
    assert error.kind == "transient" and "server had an error" in error.message


async def test_a_read_timeout_mid_stream_is_transient(
    server: Any, collect: Any, hello: ModelRequest
) -> None:
    provider = OpenAIProvider(f"{server.url}/v1", timeout=0.3)
    server.sse([text("slow")], end="hang")
    with anyio.fail_after(5):
        events, error = await collect(provider, hello)
    await provider.aclose()
    assert events == [TextDelta("slow")]
    assert error.kind == "transient" and "timed out" in error.message


async def test_a_read_timeout_before_the_answer_is_transient(
    server: Any, collect: Any, hello: ModelRequest
) -> None:
    provider = OpenAIProvider(f"{server.url}/v1", timeout=0.3)
    server.sse([DONE], head_delay=3)
    with anyio.fail_after(5):
        events, error = await collect(provider, hello)
    await provider.aclose()
    assert events == [] and error.kind == "transient"


# --- cancellation -------------------------------------------------------------------------------


async def test_breaking_out_of_the_stream_closes_the_connection_at_once(
    server: Any, provider: OpenAIProvider, hello: ModelRequest
) -> None:
    server.sse([text("one"), text("two")], end="hang")
    async with contextlib.aclosing(provider.stream(hello)) as stream:  # type: ignore[type-var]
        async for event in stream:
            assert event == TextDelta("one")
            break
    assert await server.wait_disconnect(timeout=1.0) < 1.0


async def test_cancelling_the_consumer_closes_the_connection_at_once(
    server: Any, provider: OpenAIProvider, hello: ModelRequest
) -> None:
    server.sse([text("one")], end="hang")
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
    assert seen == [TextDelta("one")]
    assert await server.wait_disconnect(timeout=1.0) < 1.0


# --- configuration ------------------------------------------------------------------------------


async def test_base_url_and_key_come_from_the_environment(
    server: Any, collect: Any, hello: ModelRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/compat/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    provider = OpenAIProvider()
    server.sse([text("hi"), chunk(finish="stop"), DONE])
    _, error = await collect(provider, hello)
    await provider.aclose()
    assert error is None
    sent = server.requests[0]
    assert sent.path == "/compat/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-from-env"


async def test_a_local_server_needs_no_key(
    server: Any, collect: Any, hello: ModelRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    provider = OpenAIProvider(f"{server.url}/v1")
    server.sse([text("hi"), chunk(finish="stop"), DONE])
    _, error = await collect(provider, hello)
    await provider.aclose()
    assert error is None
    assert "authorization" not in server.requests[0].headers


async def test_the_public_api_without_a_key_fails_terminally_without_a_request(
    collect: Any, hello: ModelRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    provider = OpenAIProvider()
    _, error = await collect(provider, hello)
    assert error.kind == "terminal" and "OPENAI_API_KEY" in error.message


def test_default_providers_are_built_without_keys_or_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    providers = default_providers()
    assert [p.name for p in providers] == ["openai", "anthropic"]
    assert all(isinstance(p, ModelProvider) for p in providers)
    assert providers[0].supports("any-local-model:7b")


def test_context_windows_come_from_the_table_and_can_be_overridden() -> None:
    provider = OpenAIProvider(context_windows={"llama3.2": 4096, "my-model": 32768})
    assert provider.context_window("gpt-4o-mini") == 128_000
    assert provider.context_window("gpt-4.1-nano-2025-04-14") == 1_047_576
    assert provider.context_window("llama3.2:3b") == 4096
    assert provider.context_window("my-model") == 32768
    assert provider.context_window("something-unknown") == 8192
    assert OpenAIProvider(context_windows={"*": 2048}).context_window("unknown") == 2048


async def test_a_plain_break_without_aclosing_also_drops_the_connection_soon(
    server: Any, provider: OpenAIProvider, hello: ModelRequest
) -> None:
    server.sse([text("one"), text("two")], end="hang")
    async for _ in provider.stream(hello):
        break  # the generator is finalised by the event loop's async-generator hook
    assert await server.wait_disconnect(timeout=1.0) < 1.0


def test_one_provider_works_from_successive_event_loops(server: Any, hello: ModelRequest) -> None:
    import asyncio

    provider = OpenAIProvider(f"{server.url}/v1", timeout=2.0)

    async def once() -> list[Any]:
        server.sse([text("hi"), chunk(finish="stop"), DONE])
        return [event async for event in provider.stream(hello)]

    first = asyncio.run(once())
    second = asyncio.run(once())
    assert first == second == [TextDelta("hi"), Finished("stop", None)]
