"""A real ``hearth.App`` talking to fake OpenAI-compatible and Anthropic servers over loopback HTTP.

Each behaviour runs against both providers: the agent, its tools and the runtime are real; only the
model is a scripted HTTP server streaming real SSE (``fakellm.FakeServer``). The tests check both
sides: the canonical stream the runtime wrote, and the requests the server received.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from fakellm import FakeServer

import hearth
import hearth.app
import hearth.runtime.recovery
from hearth.providers import AnthropicProvider, OpenAIProvider
from hearth.providers.base import ModelProvider
from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantTextDelta,
    AssistantToolCall,
    Compaction,
    Record,
    Signal,
    SubmissionSettled,
    ToolOutcome,
    ToolResultsCommitted,
    UserMessage,
)
from hearth.runtime.compaction import SUMMARY_PROMPT
from hearth.testing import CrashHarness

pytestmark = pytest.mark.anyio

APPS = Path(__file__).resolve().parents[1] / "apps"

# --- speaking each provider's wire format ---------------------------------------------------------


class OpenAIDialect:
    """Chat Completions SSE, and reading a Chat Completions request body."""

    name = "openai"
    model = "openai/m"

    def provider(self, url: str, **kw: Any) -> ModelProvider:
        return OpenAIProvider(f"{url}/v1", "sk-test", timeout=5.0, connect_timeout=2.0, **kw)

    @staticmethod
    def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> str:
        body = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
        }
        return f"data: {json.dumps(body)}\n\n"

    def partial(self, *texts: str) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})] + [
            self._chunk({"content": t}) for t in texts
        ]

    def reply(self, *texts: str) -> list[str]:
        usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
        return [
            *self.partial(*texts),
            self._chunk(finish="stop"),
            f"data: {json.dumps(usage)}\n\n",
            "data: [DONE]\n\n",
        ]

    def tool_calls(self, calls: list[tuple[str, str, list[str]]], text: str = "") -> list[str]:
        """``calls`` are (id, name, argument fragments); fragments of all calls interleave."""
        events = self.partial(text) if text else []
        for i, (call_id, name, _) in enumerate(calls):
            fragment = {"index": i, "id": call_id, "type": "function"}
            events.append(self._chunk({"tool_calls": [{**fragment, "function": {"name": name}}]}))
        longest = max(len(parts) for _, _, parts in calls)
        for n in range(longest):
            for i, (_, _, parts) in enumerate(calls):
                if n < len(parts):
                    fragment = {"index": i, "function": {"arguments": parts[n]}}
                    events.append(self._chunk({"tool_calls": [fragment]}))
        return [*events, self._chunk(finish="tool_calls"), "data: [DONE]\n\n"]

    def tool_use_without_calls(self, text: str) -> list[str]:
        """A reply whose finish reason says tool calls, with none (a local server's tool-call
        parser that failed)."""
        return [*self.partial(text), self._chunk(finish="tool_calls"), "data: [DONE]\n\n"]

    def failure(self, message: str, kind: str = "server_error") -> dict[str, Any]:
        return {"error": {"message": message, "type": kind}}

    def overflow(self) -> dict[str, Any]:
        return {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 9000 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        }

    # reading requests
    def system(self, body: dict[str, Any]) -> str:
        first = body["messages"][0]
        return str(first["content"]) if first["role"] == "system" else ""

    def turns(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        """(role, text) of every message but the system prompt; tool results as ``tool``."""
        out = []
        for m in body["messages"]:
            if m["role"] != "system":
                out.append((m["role"], m.get("content") or ""))
        return out

    def tool_results(self, body: dict[str, Any]) -> dict[str, Any]:
        return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}

    def call_ids(self, body: dict[str, Any]) -> list[str]:
        return [
            c["id"]
            for m in body["messages"]
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
        ]


class AnthropicDialect:
    """Messages API SSE, and reading a Messages request body."""

    name = "anthropic"
    model = "anthropic/claude-test"

    def provider(self, url: str, **kw: Any) -> ModelProvider:
        return AnthropicProvider(url, "sk-ant-test", timeout=5.0, connect_timeout=2.0, **kw)

    @staticmethod
    def _ev(name: str, payload: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps({'type': name, **payload})}\n\n"

    def _start(self) -> str:
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-test",
            "stop_reason": None,
            "usage": {"input_tokens": 9, "output_tokens": 1},
        }
        return self._ev("message_start", {"message": message})

    def _finish(self, reason: str) -> list[str]:
        delta = {"delta": {"stop_reason": reason}, "usage": {"output_tokens": 3}}
        return [self._ev("message_delta", delta), self._ev("message_stop", {})]

    def partial(self, *texts: str) -> list[str]:
        block = {"index": 0, "content_block": {"type": "text", "text": ""}}
        return [self._start(), self._ev("content_block_start", block)] + [
            self._ev(
                "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": t}}
            )
            for t in texts
        ]

    def reply(self, *texts: str) -> list[str]:
        stop = self._ev("content_block_stop", {"index": 0})
        return [*self.partial(*texts), stop, *self._finish("end_turn")]

    def tool_calls(self, calls: list[tuple[str, str, list[str]]], text: str = "") -> list[str]:
        # Anthropic streams blocks one after another: each call's input arrives in pieces.
        events = [self._start()]
        first = 0
        if text:
            events = [*self.partial(text), self._ev("content_block_stop", {"index": 0})]
            first = 1
        for i, (call_id, name, parts) in enumerate(calls, start=first):
            block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            events.append(self._ev("content_block_start", {"index": i, "content_block": block}))
            for part in parts:
                delta = {"type": "input_json_delta", "partial_json": part}
                events.append(self._ev("content_block_delta", {"index": i, "delta": delta}))
            events.append(self._ev("content_block_stop", {"index": i}))
        return [*events, *self._finish("tool_use")]

    def tool_use_without_calls(self, text: str) -> list[str]:
        stop = self._ev("content_block_stop", {"index": 0})
        return [*self.partial(text), stop, *self._finish("tool_use")]

    def failure(self, message: str, kind: str = "api_error") -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}}

    def overflow(self) -> dict[str, Any]:
        return self.failure(
            "prompt is too long: 212000 tokens > 200000 maximum", "invalid_request_error"
        )

    # reading requests
    def system(self, body: dict[str, Any]) -> str:
        return str(body.get("system", ""))

    def turns(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        out = []
        for m in body["messages"]:
            for block in m["content"]:
                if block["type"] == "text":
                    out.append((m["role"], block["text"]))
                elif block["type"] == "tool_result":
                    out.append(("tool", block["content"]))
        return out

    def tool_results(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            b["tool_use_id"]: b["content"]
            for m in body["messages"]
            for b in m["content"]
            if b["type"] == "tool_result"
        }

    def call_ids(self, body: dict[str, Any]) -> list[str]:
        return [
            b["id"]
            for m in body["messages"]
            if m["role"] == "assistant"
            for b in m["content"]
            if b["type"] == "tool_use"
        ]


Dialect = OpenAIDialect | AnthropicDialect


@pytest.fixture(params=[OpenAIDialect(), AnthropicDialect()], ids=lambda d: d.name)
def dialect(request: pytest.FixtureRequest) -> Dialect:
    d: Dialect = request.param
    return d


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hearth.runtime.recovery, "BACKOFF_BASE_S", 0.01)


# --- the agent under test ---------------------------------------------------------------------


@hearth.tool
async def get_weather(city: str) -> dict[str, Any]:
    """Look the weather up."""
    return {"city": city, "temp_c": len(city)}


@hearth.tool
async def get_time(tz: str) -> str:
    """Tell the time in a time zone."""
    return f"12:00 in {tz}"


def assistant(model: str) -> hearth.Agent:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model(model)
        ctx.use_tool(get_weather)
        ctx.use_tool(get_time)
        return "You are a helpful assistant."

    return hearth.Agent(render, name="helper")


Run = Callable[..., Any]


@pytest.fixture
async def runtime(
    server: FakeServer, dialect: Dialect, tmp_path: Path
) -> AsyncIterator[tuple[Any, ModelProvider]]:
    provider = dialect.provider(server.url)
    app = hearth.App([assistant(dialect.model)], db="memory", providers=[provider])
    async with app.run() as rt:
        yield rt, provider
    await provider.aclose()


async def ask(rt: Any, text: str, id: str = "c1") -> Any:
    return await rt.read(await rt.dispatch("helper", id, text), timeout=20)


async def history(rt: Any, id: str = "c1") -> list[Record]:
    records: list[Record] = await rt.history("helper", id)
    return records


def of(records: list[Record], kind: type[Record]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


def bodies(server: FakeServer) -> list[dict[str, Any]]:
    return [r.json() for r in server.requests]


# --- replies and tools ------------------------------------------------------------------------


async def test_a_plain_reply_is_streamed_into_the_stream_and_settles_completed(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.sse(dialect.reply("Hel", "lo ", "there"))
    reply = await ask(rt, "hi")
    assert (reply.text, reply.outcome) == ("Hello there", "completed")
    records = await history(rt)
    kinds = [r.type for r in records]
    assert kinds[:3] == ["conversation_created", "user_message", "assistant_message_started"]
    assert kinds[-2:] == ["assistant_message_completed", "submission_settled"]
    assert "".join(d.delta for d in of(records, AssistantTextDelta)) == "Hello there"
    (done,) = of(records, AssistantMessageCompleted)
    assert (done.stop_reason, done.text) == ("stop", "Hello there")
    assert done.usage is not None and done.usage["output_tokens"] == 3
    (started,) = of(records, AssistantMessageStarted)
    assert started.model == dialect.model
    (request,) = bodies(server)
    assert request["stream"] is True
    assert dialect.turns(request) == [("user", "hi")]
    assert dialect.system(request) == "You are a helpful assistant."


async def test_split_and_parallel_tool_calls_run_real_tools_and_send_results_back(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.sse(
        dialect.tool_calls(
            [
                ("call_w1", "get_weather", ['{"ci', 'ty": "Os', 'lo"}']),
                ("call_t2", "get_time", ['{"tz": ', '"Europe/Oslo"}']),
            ],
            text="Checking.",
        )
    )
    server.sse(dialect.reply("It is 12:00 and 4 degrees."))
    reply = await ask(rt, "weather and time in Oslo?")
    assert reply.text == "It is 12:00 and 4 degrees."
    records = await history(rt)
    calls = of(records, AssistantToolCall)
    assert [(c.tool_call_id, c.name, c.arguments) for c in calls] == [
        ("call_w1", "get_weather", {"city": "Oslo"}),
        ("call_t2", "get_time", {"tz": "Europe/Oslo"}),
    ]
    outcomes = {o.tool_call_id: o for o in of(records, ToolOutcome)}
    assert outcomes["call_w1"].content == {"city": "Oslo", "temp_c": 4}
    assert outcomes["call_t2"].content == "12:00 in Europe/Oslo"
    assert not any(o.is_error for o in outcomes.values())
    (committed,) = of(records, ToolResultsCommitted)
    assert committed.tool_call_ids == ["call_w1", "call_t2"]
    first, second = bodies(server)
    assert {t["name"] if "name" in t else t["function"]["name"] for t in first["tools"]} == {
        "get_weather",
        "get_time",
    }
    # The next request carries both results under the model's own ids, unchanged.
    assert dialect.call_ids(second) == ["call_w1", "call_t2"]
    results = dialect.tool_results(second)
    assert results == {"call_w1": results["call_w1"], "call_t2": "12:00 in Europe/Oslo"}
    assert json.loads(results["call_w1"]) == {"city": "Oslo", "temp_c": 4}


# --- transient errors -------------------------------------------------------------------------


async def test_429_twice_then_success_takes_exactly_three_requests(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    for _ in range(2):
        server.error(429, dialect.failure("Rate limited", "rate_limit_error"), {"retry-after": "0"})
    server.sse(dialect.reply("made it"))
    reply = await ask(rt, "hi")
    assert reply.text == "made it"
    assert len(server.requests) == 3
    records = await history(rt)
    errors = [c for c in of(records, AssistantMessageCompleted) if c.stop_reason == "error"]
    assert [(e.error["kind"], e.error["status"], e.error["retry_after"]) for e in errors] == [
        ("transient", 429, 0.0),
        ("transient", 429, 0.0),
    ]
    assert "Rate limited" in errors[0].error["message"]


async def test_a_retry_after_with_no_finite_number_is_kept_out_of_the_stream(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    """``Retry-After: inf`` was recorded as the float infinity: the attempt slept until the
    deadline, and every JSON read of the conversation answered 500 from then on."""
    rt, _ = runtime
    server.error(429, dialect.failure("Rate limited", "rate_limit_error"), {"retry-after": "inf"})
    server.error(429, dialect.failure("Rate limited"), {"retry-after-ms": "nan"})
    server.sse(dialect.reply("made it"))
    assert (await ask(rt, "hi")).text == "made it"
    errors = [c.error for c in of(await history(rt), AssistantMessageCompleted) if c.error]
    assert [(e["status"], "retry_after" in e) for e in errors] == [(429, False), (429, False)]


async def test_a_retry_after_past_the_deadline_fails_at_once_naming_the_providers_error(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime  # the agent's deadline: an hour
    server.error(429, dialect.failure("Rate limited", "rate_limit_error"), {"retry-after": "7200"})
    with pytest.raises(hearth.SubmissionFailed) as failed:
        await ask(rt, "hi")
    assert failed.value.type == "provider_error"
    message = failed.value.error["message"]
    assert "Rate limited" in message and "past the submission's deadline" in message
    assert len(server.requests) == 1


async def test_a_reply_that_says_tool_use_without_a_call_is_the_answer(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    """It was recorded as a tool turn with no calls, and the model was asked again at once, with
    nothing new, until the deadline: 42 requests in 6 s against a fake server."""
    rt, _ = runtime
    server.sse(dialect.tool_use_without_calls("Let me look that up."))
    server.sse(dialect.reply("unwanted"))
    assert (await ask(rt, "hi")).text == "Let me look that up."
    assert len(server.requests) == 1
    (done,) = of(await history(rt), AssistantMessageCompleted)
    assert done.stop_reason == "stop"


async def test_an_emoji_split_between_two_deltas_is_one_character(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    """JSON escapes a character outside the BMP as two UTF-16 halves; a provider that streams
    the halves in two chunks made each a U+FFFD."""
    rt, _ = runtime
    server.sse(dialect.reply("smile \ud83d", "\ude00 done \ud83d"))
    assert (await ask(rt, "hi")).text == "smile \U0001f600 done \ufffd"


@pytest.mark.parametrize(
    "first",
    [
        ("text", "the text before a call ends in half a pair \ud83d"),
        ("name", "get_t\ud800ime"),
        ("args", '{"tz": "a\\ud800b"}'),
    ],
    ids=lambda case: case[0],
)
async def test_half_a_surrogate_pair_from_the_model_does_not_fail_the_next_request(
    server: FakeServer, dialect: Dialect, runtime: Any, first: tuple[str, str]
) -> None:
    """The records keep U+FFFD for half a pair (no store can keep it), and the attempt went on
    from its own copy of them, which kept it raw: the next request could not be encoded, was
    retried as a provider's failure four times, and the submission failed."""
    rt, _ = runtime
    where, odd = first
    call = (
        "call_1",
        odd if where == "name" else "get_time",
        [odd if where == "args" else '{"tz": "UTC"}'],
    )
    server.sse(dialect.tool_calls([call], text=odd if where == "text" else "Checking."))
    server.sse(dialect.reply("fine"))
    reply = await ask(rt, "hi")
    assert (reply.outcome, reply.text) == ("completed", "fine")
    assert len(server.requests) == 2
    sent = json.dumps(server.requests[1].json(), ensure_ascii=False)
    assert "\ufffd" in sent and "\ud800" not in sent and "\ud83d" not in sent


async def test_a_500_then_success_is_retried(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.error(500, dialect.failure("The server had an error"))
    server.sse(dialect.reply("recovered"))
    reply = await ask(rt, "hi")
    assert (reply.text, len(server.requests)) == ("recovered", 2)
    # The failed turn showed nothing to the model: the retry is the same request.
    assert bodies(server)[0] == bodies(server)[1]


async def test_a_stream_dropped_after_partial_text_keeps_it_and_continues_from_it(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.sse(dialect.partial("The answer ", "is"), end="drop")
    server.sse(dialect.reply(" forty-two."))
    reply = await ask(rt, "what is the answer?")
    assert reply.text == "The answer is forty-two."  # the saved part and its continuation
    records = await history(rt)
    cut, done = of(records, AssistantMessageCompleted)
    assert (cut.stop_reason, cut.text, cut.error["kind"]) == ("error", "The answer is", "transient")
    (note,) = [s for s in of(records, Signal) if s.signal_type == "stream_interrupted"]
    assert cut.offset < note.offset < done.offset
    assert note.attributes["message_id"] == cut.message_id
    # The next request shows the partial as the model's own message, then the note.
    turns = dialect.turns(bodies(server)[1])
    assert turns[:2] == [("user", "what is the answer?"), ("assistant", "The answer is")]
    assert turns[2][0] == "user" and "stream_interrupted" in turns[2][1]


async def test_four_transient_errors_in_a_row_fail_with_provider_error(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    for _ in range(4):
        server.error(503, dialect.failure("Service unavailable"))
    server.sse(dialect.reply("too late"))
    with pytest.raises(hearth.SubmissionFailed) as failed:
        await ask(rt, "hi")
    assert failed.value.type == "provider_error"
    assert "Service unavailable" in failed.value.error["message"]
    assert len(server.requests) == 4  # the first try and three retries


async def test_401_fails_at_once_with_the_providers_message(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.error(401, dialect.failure("Invalid API key provided", "authentication_error"))
    with pytest.raises(hearth.SubmissionFailed) as failed:
        await ask(rt, "hi")
    assert failed.value.type == "provider_error"
    assert "Invalid API key provided" in failed.value.error["message"]
    assert len(server.requests) == 1
    (settled,) = of(await history(rt), SubmissionSettled)
    assert settled.outcome == "failed"


async def test_a_request_that_cannot_be_sent_as_json_fails_at_once_saying_why(
    server: FakeServer, dialect: Dialect
) -> None:
    """Half a surrogate pair in the instructions can never be sent: it was taken for the
    provider's passing failure and tried four times (with pauses) before the submission failed
    with an encoder's message."""

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model(dialect.model)
        return "You are \ud800 helpful."

    provider = dialect.provider(server.url)
    app = hearth.App([hearth.Agent(render, name="helper")], db="memory", providers=[provider])
    async with app.run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await ask(rt, "hi")
        assert failed.value.type == "provider_error"
        message = failed.value.error["message"]
        assert "cannot be sent as JSON" in message and "instructions" in message
        assert server.requests == []
    await provider.aclose()


# --- overflow and compaction ------------------------------------------------------------------


async def test_overflow_compacts_with_a_toolless_summary_then_retries_the_turn(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.sse(dialect.reply("Hi, I remember Oslo."))
    await ask(rt, "I live in Oslo.")
    server.error(400, dialect.overflow())
    server.sse(dialect.reply("The user lives in Oslo."))
    server.sse(dialect.reply("You live in Oslo."))
    reply = await ask(rt, "Where do I live?")
    assert reply.text == "You live in Oslo."
    _, overflowed, summary_request, retried = bodies(server)
    # The summary is asked for without tools, over the records before this submission.
    assert "tools" not in summary_request and "tools" in overflowed
    assert dialect.system(summary_request) == SUMMARY_PROMPT
    summarised = dialect.turns(summary_request)
    assert summarised[:2] == [("user", "I live in Oslo."), ("assistant", "Hi, I remember Oslo.")]
    assert "Where do I live?" not in json.dumps(summary_request)
    records = await history(rt)
    (compaction,) = of(records, Compaction)
    (_, mine) = of(records, UserMessage)
    assert compaction.summary == "The user lives in Oslo."
    assert compaction.first_kept_offset == mine.offset
    assert compaction.tokens_before > 0
    # The retried turn: the summary, then only the records from first_kept_offset.
    assert "The user lives in Oslo." in dialect.system(retried)
    assert dialect.turns(retried) == [("user", "Where do I live?")]
    assert "tools" in retried


async def test_a_second_overflow_right_after_compaction_fails(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.sse(dialect.reply("ok"))
    await ask(rt, "first")
    server.error(400, dialect.overflow())
    server.sse(dialect.reply("summary"))
    server.error(400, dialect.overflow())
    with pytest.raises(hearth.SubmissionFailed) as failed:
        await ask(rt, "second")
    assert failed.value.type == "context_overflow"
    assert "after compaction" in failed.value.error["message"]
    assert len(server.requests) == 4


async def test_a_transient_error_while_summarising_is_retried(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.sse(dialect.reply("ok"))
    await ask(rt, "first")
    server.error(400, dialect.overflow())
    server.error(503, dialect.failure("Service unavailable"), {"retry-after": "0"})
    server.sse(dialect.reply("the summary"))
    server.sse(dialect.reply("fine"))
    assert (await ask(rt, "second")).text == "fine"
    assert len(server.requests) == 5
    (compaction,) = of(await history(rt), Compaction)
    assert compaction.summary == "the summary"


async def test_a_terminal_error_while_summarising_fails_the_submission(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.sse(dialect.reply("ok"))
    await ask(rt, "first")
    server.error(400, dialect.overflow())
    server.error(403, dialect.failure("No access to this model", "permission_error"))
    with pytest.raises(hearth.SubmissionFailed) as failed:
        await ask(rt, "second")
    assert failed.value.type == "provider_error"
    assert "No access to this model" in failed.value.error["message"]


async def test_a_summary_call_that_overflows_is_retried_with_the_recent_part(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    rt, _ = runtime
    server.sse(dialect.reply("ok"))
    await ask(rt, "first")
    server.error(400, dialect.overflow())
    server.error(400, dialect.overflow())  # the summary call itself is too long
    server.sse(dialect.reply("the summary"))
    server.sse(dialect.reply("fine"))
    assert (await ask(rt, "second")).text == "fine"
    whole, recent = bodies(server)[2:4]
    assert dialect.turns(whole)[:2] == [("user", "first"), ("assistant", "ok")]
    assert "first" not in [text for _, text in dialect.turns(recent)]
    assert ("assistant", "ok") in dialect.turns(recent)
    assert "left out" in json.dumps(recent)


async def test_a_summary_call_that_cannot_be_cut_enough_fails_with_context_overflow(
    server: FakeServer, dialect: Dialect, runtime: Any
) -> None:
    """The last turn's tool results are never sent without their call: when that turn alone was
    too long for the model, the summary call was asked again at once, unchanged, until the
    deadline (436 requests in 5 s against a fake server)."""
    rt, _ = runtime
    weather = [(f"call_{i}", "get_weather", [json.dumps({"city": "Oslo"})]) for i in range(3)]
    server.sse(dialect.tool_calls(weather))
    for _ in range(30):
        server.error(400, dialect.overflow())
    with pytest.raises(hearth.SubmissionFailed) as failed:
        await ask(rt, "hi")
    assert failed.value.type == "context_overflow"
    assert "cannot be compacted" in failed.value.error["message"]
    assert len(server.requests) <= 5


async def test_history_too_long_for_one_summary_call_keeps_its_recent_part(
    server: FakeServer, dialect: Dialect, tmp_path: Path
) -> None:
    # The conversation grew under a large window; the model now runs with a small one.
    model = dialect.model.partition("/")[2]
    db = f"sqlite:///{tmp_path / 'h.db'}"
    for window in (8000, 1000):
        provider = dialect.provider(server.url, context_windows={model: window})
        app = hearth.App([assistant(dialect.model)], db=db, providers=[provider])
        async with app.run() as rt:
            if window == 8000:
                server.sse(dialect.reply("ok1"))
                await ask(rt, "A" * 5000)
            else:
                server.sse(dialect.reply("the summary"))
                server.sse(dialect.reply("fine"))
                reply = await ask(rt, "next?")
        await provider.aclose()
    assert reply.text == "fine"
    _, summary_request, asked = bodies(server)
    assert "AAAA" not in json.dumps(summary_request)
    assert ("assistant", "ok1") in dialect.turns(summary_request)
    assert "left out" in json.dumps(summary_request)
    assert dialect.turns(asked) == [("user", "next?")]


async def test_the_pre_call_estimate_compacts_before_asking(
    server: FakeServer, dialect: Dialect
) -> None:
    model = dialect.model.partition("/")[2]
    provider = dialect.provider(server.url, context_windows={model: 600})
    app = hearth.App([assistant(dialect.model)], db="memory", providers=[provider])
    later = "and now? " + "y" * 300
    async with app.run() as rt:
        server.sse(dialect.reply("noted"))
        await ask(rt, "remember: " + "x" * 1200)  # fits the window alone
        server.sse(dialect.reply("a short summary"))
        server.sse(dialect.reply("done"))
        reply = await ask(rt, later)  # together with the history, it does not
        records = await history(rt)
    await provider.aclose()
    assert reply.text == "done"
    _, summary_request, asked = bodies(server)
    assert "tools" not in summary_request
    assert dialect.turns(asked) == [("user", later)]
    assert "a short summary" in dialect.system(asked)
    # No overflow error was needed: the estimate caught it first.
    assert not [c for c in of(records, AssistantMessageCompleted) if c.stop_reason == "error"]


# --- crashes through a real client ------------------------------------------------------------


def crash_harness(server: FakeServer, tmp_path: Path) -> CrashHarness:
    """The app of ``tests/apps/providerapp.py`` in child processes, talking to ``server``."""
    return CrashHarness(
        "providerapp:app",
        db=tmp_path / "hearth.db",
        env={
            "HEARTH_FAKE_LLM_URL": server.url,
            "HEARTH_LEASE_S": "5",
            "HEARTH_HEARTBEAT_S": "1",
            "HEARTH_SCAN_S": "1",
        },
        pythonpath=[APPS],
    )


@pytest.mark.crash
def test_a_sigkill_mid_stream_is_recovered_from_the_durable_partial(
    server: FakeServer, dialect: Dialect, tmp_path: Path
) -> None:
    harness = crash_harness(server, tmp_path)
    agent = f"{dialect.name}-chat"
    server.sse(dialect.partial("The answer ", "is ", "forty"), delay=0.2, end="hang")
    first = harness.run(
        dispatch=[(agent, "c1", "what is the answer?")], crash_at="after:assistant_text_delta"
    )
    assert first.killed
    partial = "".join(d.delta for d in of(harness.history(f"{agent}/c1"), AssistantTextDelta))
    assert partial.startswith("The answer ")
    server.sse(dialect.reply(" forty-two."))
    assert harness.run().ok
    records = harness.history(f"{agent}/c1")
    cut, done = of(records, AssistantMessageCompleted)
    assert (cut.stop_reason, cut.text) == ("aborted", partial)
    assert done.stop_reason == "stop"
    (note,) = [s for s in of(records, Signal) if s.signal_type == "stream_interrupted"]
    assert cut.offset < note.offset < done.offset
    (settled,) = of(records, SubmissionSettled)
    assert (settled.outcome, settled.reply) == ("completed", partial + " forty-two.")
    assert len(of(records, UserMessage)) == 1
    assert len(server.requests) == 2
    turns = dialect.turns(bodies(server)[1])
    assert turns[0] == ("user", "what is the answer?")
    assert turns[1] == ("assistant", partial)
    assert turns[2][0] == "user" and "stream_interrupted" in turns[2][1]


@pytest.mark.crash
def test_the_transient_budget_is_counted_from_durable_history_across_a_crash(
    server: FakeServer, tmp_path: Path
) -> None:
    d = OpenAIDialect()
    harness = crash_harness(server, tmp_path)
    for _ in range(2):
        server.error(503, d.failure("Service unavailable"), {"retry-after": "0"})
    first = harness.run(
        dispatch=[("openai-chat", "c1", "hi")], crash_at="after:assistant_message_completed#2"
    )
    assert first.killed and len(server.requests) == 2
    # Two more errors exhaust the budget (four in a row). Had the restart reset the count, the
    # new process would retry past them and reach the reply.
    for _ in range(2):
        server.error(503, d.failure("Service unavailable"), {"retry-after": "0"})
    server.sse(d.reply("too late"))
    assert harness.run().ok
    assert len(server.requests) == 4
    (sub,) = harness.submissions("openai-chat/c1")
    assert (sub.outcome, sub.attempt) == ("failed", 2)
    assert sub.error is not None and sub.error["type"] == "provider_error"
    assert "Service unavailable" in sub.error["message"]
    records = harness.history("openai-chat/c1")
    errors = [c for c in of(records, AssistantMessageCompleted) if c.stop_reason == "error"]
    assert [e.attempt for e in errors] == [1, 1, 2, 2]
    assert len(of(records, SubmissionSettled)) == 1


# --- growth: rebuilding the context after a compaction ----------------------------------------


class CountingStore:
    """A store that counts the records ``read`` hands out (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.records_read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def read(
        self, conversation_id: str, after: int = -1, limit: int | None = None
    ) -> list[Record]:
        records: list[Record] = await self._inner.read(conversation_id, after=after, limit=limit)
        self.records_read += len(records)
        return records


async def test_after_a_compaction_the_context_is_rebuilt_from_the_records_it_keeps(
    server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores: list[CountingStore] = []
    real_open_store = hearth.app.open_store

    def counting_open_store(url: str | None, **options: Any) -> Any:
        stores.append(CountingStore(real_open_store(url, **options)))
        return stores[-1]

    monkeypatch.setattr(hearth.app, "open_store", counting_open_store)
    d = OpenAIDialect()
    db = f"sqlite:///{tmp_path / 'long.db'}"

    def make_app() -> tuple[hearth.App, ModelProvider]:
        provider = d.provider(server.url)
        return hearth.App([assistant(d.model)], db=db, providers=[provider]), provider

    # A conversation of over 3,000 records, then an overflow that compacts it.
    app, provider = make_app()
    async with app.run() as rt:
        server.sse(d.reply("ok"))
        await ask(rt, "start")
        old: list[Record] = []
        for i in range(1500):
            old.append(UserMessage(id=f"old{i}:input", message_id=f"old{i}", content=f"q{i}"))
            old.append(
                AssistantMessageCompleted(
                    id=f"old{i}:a", message_id=f"a{i}", text=f"a{i}", stop_reason="stop"
                )
            )
        for n in range(0, len(old), 500):
            await rt.store.append("helper/c1", old[n : n + 500])
        server.error(400, d.overflow())
        server.sse(d.reply("SUMMARY of 1500 questions"))
        server.sse(d.reply("fine"))
        assert (await ask(rt, "now")).text == "fine"
        records = await history(rt)
    await provider.aclose()
    assert len(records) > 3000
    (compaction,) = of(records, Compaction)
    summary_request = bodies(server)[-2]
    assert len(summary_request["messages"]) > 3000  # the summary saw the whole old conversation

    # A new process answers the next message: it reads only what follows first_kept_offset.
    app, provider = make_app()
    async with app.run() as rt:
        store = stores[-1]
        server.sse(d.reply("still fine"))
        assert (await ask(rt, "again")).text == "still fine"
        last_offset = (await history(rt))[-1].offset
        read_by_runtime = store.records_read - (last_offset + 1)  # minus history() itself
    await provider.aclose()
    kept = last_offset - compaction.first_kept_offset + 1
    assert 0 < read_by_runtime <= kept < 20
    asked = bodies(server)[-1]
    assert "SUMMARY of 1500 questions" in d.system(asked)
    assert d.turns(asked) == [
        ("user", "now"),
        ("assistant", "fine"),
        ("user", "again"),
    ]
