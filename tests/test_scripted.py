"""The scripted model provider of ``hearth.testing``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from hearth.errors import ProviderError
from hearth.providers.base import (
    AssistantTurn,
    Finished,
    Message,
    ModelEvent,
    ModelProvider,
    ModelRequest,
    SystemNote,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    UserTurn,
    estimate_tokens,
)
from hearth.testing.scripted import (
    ScriptedModel,
    Step,
    call,
    calls,
    error,
    overflow,
    reply,
    stall,
    stream,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def request(*messages: Message, model: str = "m") -> ModelRequest:
    return ModelRequest(model=model, system="be brief", messages=messages)


def history(assistant_turns: int) -> tuple[Message, ...]:
    """A conversation with ``assistant_turns`` assistant messages, other messages in between."""
    out: list[Message] = [UserTurn("hi")]
    for n in range(assistant_turns):
        out.append(AssistantTurn(f"answer {n}"))
        out.append(UserTurn(f"more {n}"))
    return tuple(out)


async def collect(model: ScriptedModel, req: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(req)]


def text_of(events: list[ModelEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


# --- the provider surface ------------------------------------------------------------------------


def test_is_a_model_provider_named_scripted_serving_only_its_own_name() -> None:
    model = ScriptedModel("m", [reply("hi")], context_window=4096)
    assert isinstance(model, ModelProvider)
    assert model.name == "scripted"
    assert model.supports("m")
    assert not model.supports("other")
    assert model.context_window("m") == 4096
    assert ScriptedModel("n", []).context_window("n") == 128_000


@pytest.mark.anyio
async def test_aclose_is_a_no_op() -> None:
    model = ScriptedModel("m", [reply("hi")])
    await model.aclose()
    assert text_of(await collect(model, request())) == "hi"


@pytest.mark.anyio
async def test_requests_keeps_the_latest_ones_not_every_request_ever_sent() -> None:
    model = ScriptedModel("m", lambda req: reply(str(req.messages[0].content)), keep_requests=3)
    for n in range(20):
        await collect(model, request(UserTurn(f"q{n}")))
        assert 3 <= len(model.requests) < 6 or n < 3
        assert model.requests[-1].messages[0].content == f"q{n}"
    everything = ScriptedModel("m", [reply("hi")], repeat_last=True, keep_requests=None)
    for _ in range(20):
        await collect(everything, request())
    assert len(everything.requests) == 20
    assert ScriptedModel("m", [reply("hi")]).keep_requests == 1000
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="keep_requests"):
            ScriptedModel("m", [reply("hi")], keep_requests=bad)  # type: ignore[arg-type]


# --- choosing the step ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_step_is_chosen_by_the_number_of_assistant_turns() -> None:
    model = ScriptedModel("m", [reply("zero"), reply("one"), reply("two")])
    assert text_of(await collect(model, request(*history(0)))) == "zero"
    assert text_of(await collect(model, request(*history(2)))) == "two"
    assert text_of(await collect(model, request(*history(1)))) == "one"


@pytest.mark.anyio
async def test_aborted_turns_count_and_other_messages_do_not() -> None:
    model = ScriptedModel("m", [reply("zero"), reply("one"), reply("two")])
    messages: tuple[Message, ...] = (
        UserTurn("hi"),
        AssistantTurn("par", aborted=True),
        SystemNote("stream_interrupted", "the stream was cut off"),
        ToolResult("call_0_0", "t", {"ok": True}),
        UserTurn("again"),
    )
    assert text_of(await collect(model, request(*messages))) == "one"


@pytest.mark.anyio
async def test_a_fresh_instance_plays_the_same_step_for_the_same_history() -> None:
    script: list[Step] = [calls(call("t", x=1)), reply("done")]
    first = await collect(ScriptedModel("m", script), request(*history(1)))
    after_restart = await collect(ScriptedModel("m", script), request(*history(1)))
    assert first == after_restart
    assert text_of(first) == "done"


@pytest.mark.anyio
async def test_repeat_last_plays_the_last_step_past_the_end() -> None:
    model = ScriptedModel("m", [reply("first"), reply("again")], repeat_last=True)
    assert text_of(await collect(model, request(*history(5)))) == "again"


@pytest.mark.anyio
async def test_past_the_end_is_a_terminal_provider_error() -> None:
    model = ScriptedModel("bot", [reply("only")])
    with pytest.raises(ProviderError) as caught:
        await collect(model, request(*history(1)))
    assert caught.value.kind == "terminal"
    assert caught.value.message == "scripted model 'bot' has no response #1"


def test_repeat_last_needs_a_step() -> None:
    with pytest.raises(ValueError):
        ScriptedModel("m", [], repeat_last=True)


# --- text ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_reply_is_one_delta_then_stop_with_usage() -> None:
    model = ScriptedModel("m", [reply("Hello there")])
    req = request(*history(0))
    events = await collect(model, req)
    assert events == [
        TextDelta("Hello there"),
        Finished("stop", {"input_tokens": estimate_tokens(req), "output_tokens": 3}),
    ]


@pytest.mark.anyio
async def test_a_bare_string_is_a_reply() -> None:
    model = ScriptedModel("m", ["plain"])
    events = await collect(model, request())
    assert events[0] == TextDelta("plain")
    assert isinstance(events[-1], Finished) and events[-1].stop_reason == "stop"


@pytest.mark.anyio
async def test_stream_yields_chunks_in_order_after_their_delays() -> None:
    model = ScriptedModel("m", [stream("a", "b", "c", delays=[0.0, 0.02, 0.0])])
    started = time.monotonic()
    events = await collect(model, request())
    assert events[:3] == [TextDelta("a"), TextDelta("b"), TextDelta("c")]
    assert isinstance(events[3], Finished) and events[3].stop_reason == "stop"
    assert time.monotonic() - started >= 0.015  # the 20 ms delay was slept, loosely


@pytest.mark.anyio
async def test_stream_with_one_delay_for_every_chunk() -> None:
    model = ScriptedModel("m", [stream("x", "y", delay=0.001)])
    assert text_of(await collect(model, request())) == "xy"


def test_stream_rejects_delays_of_the_wrong_length() -> None:
    with pytest.raises(ValueError):
        stream("a", "b", delays=[0.1])


# --- tool calls ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_parallel_calls_get_positional_ids_after_the_text() -> None:
    model = ScriptedModel(
        "m",
        [reply("first"), calls(call("a", x=1), call("b"), call("c", id="mine"), text="Checking")],
    )
    events = await collect(model, request(*history(1)))
    assert events[:4] == [
        TextDelta("Checking"),
        ToolCallEvent(ToolCall("call_1_0", "a", {"x": 1})),
        ToolCallEvent(ToolCall("call_1_1", "b", {})),
        ToolCallEvent(ToolCall("mine", "c", {})),
    ]
    finished = events[4]
    assert isinstance(finished, Finished) and finished.stop_reason == "tool_use"
    assert finished.usage is not None and finished.usage["output_tokens"] > 0


@pytest.mark.anyio
async def test_a_bare_call_is_one_call_without_text() -> None:
    model = ScriptedModel("m", [call("t", q="x")])
    events = await collect(model, request())
    assert events[0] == ToolCallEvent(ToolCall("call_0_0", "t", {"q": "x"}))
    assert isinstance(events[1], Finished) and events[1].stop_reason == "tool_use"


def test_call_takes_arguments_as_a_mapping_and_as_keywords() -> None:
    spec = call("lookup", {"id": 7, "name": "n"}, limit=3, id="c1")
    assert spec.name == "lookup"
    assert spec.arguments == {"id": 7, "name": "n", "limit": 3}
    assert spec.id == "c1"
    with pytest.raises(ValueError):
        call("lookup", {"limit": 1}, limit=2)


@pytest.mark.anyio
async def test_emitted_arguments_are_copies_of_the_script() -> None:
    model = ScriptedModel("m", [call("t", items=1)], repeat_last=True)
    first = (await collect(model, request()))[0]
    assert isinstance(first, ToolCallEvent)
    first.call.arguments["items"] = 99
    again = (await collect(model, request()))[0]
    assert isinstance(again, ToolCallEvent) and again.call.arguments == {"items": 1}


def test_calls_needs_at_least_one_call() -> None:
    with pytest.raises(ValueError):
        calls(text="nothing")


# --- errors, overflow, stalls --------------------------------------------------------------------


@pytest.mark.anyio
async def test_error_after_chunks_yields_the_chunks_first() -> None:
    model = ScriptedModel(
        "m",
        [error("transient", "overloaded", status=529, retry_after=1.5, after_chunks=["par", "t"])],
    )
    seen: list[ModelEvent] = []
    with pytest.raises(ProviderError) as caught:
        async for event in model.stream(request()):
            seen.append(event)
    assert seen == [TextDelta("par"), TextDelta("t")]
    assert caught.value.kind == "transient"
    assert caught.value.message == "overloaded"
    assert caught.value.status == 529
    assert caught.value.retry_after == 1.5


@pytest.mark.anyio
async def test_error_defaults_to_transient() -> None:
    with pytest.raises(ProviderError) as caught:
        await collect(ScriptedModel("m", [error()]), request())
    assert caught.value.kind == "transient"


def test_error_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError):
        error("flaky")


@pytest.mark.anyio
async def test_overflow_raises_an_overflow_error() -> None:
    model = ScriptedModel("m", [overflow(), reply("fits now")])
    with pytest.raises(ProviderError) as caught:
        await collect(model, request())
    assert caught.value.kind == "overflow"


@pytest.mark.anyio
async def test_stall_streams_its_chunks_then_hangs_until_cancelled() -> None:
    model = ScriptedModel("m", [stall(["thinking", "..."])])
    seen: list[ModelEvent] = []
    both_chunks = asyncio.Event()

    async def consume() -> None:
        async for event in model.stream(request()):
            seen.append(event)
            if len(seen) == 2:
                both_chunks.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(both_chunks.wait(), timeout=1.0)
    await asyncio.sleep(0.02)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=1.0)
    assert seen == [TextDelta("thinking"), TextDelta("...")]


@pytest.mark.anyio
async def test_stall_with_seconds_stops_normally_afterwards() -> None:
    model = ScriptedModel("m", [stall("slow", seconds=0.01)])
    events = await collect(model, request())
    assert events[0] == TextDelta("slow")
    assert isinstance(events[1], Finished) and events[1].stop_reason == "stop"


@pytest.mark.anyio
async def test_a_long_stream_delay_is_cancelled_promptly() -> None:
    model = ScriptedModel("m", [stream("late", delay=60.0)])
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(collect(model, request()), timeout=0.05)
    assert time.monotonic() - started < 5.0


# --- computed steps ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_callable_script_sees_the_request() -> None:
    def answer(req: ModelRequest) -> Step:
        last = req.messages[-1]
        return reply(f"you said {last.content}" if isinstance(last, UserTurn) else "?")

    model = ScriptedModel("m", answer)
    assert text_of(await collect(model, request(UserTurn("ping")))) == "you said ping"
    assert text_of(await collect(model, request(*history(7)))) == "you said more 6"


@pytest.mark.anyio
async def test_an_async_step_function_inside_a_list() -> None:
    async def saw_interruption(req: ModelRequest) -> Step:
        await asyncio.sleep(0)
        interrupted = any(
            isinstance(m, ToolResult) and m.is_error and m.content.get("type") == "interrupted"
            for m in req.messages
        )
        return reply("retrying the tool" if interrupted else "all fine")

    model = ScriptedModel("m", [call("slow_tool"), saw_interruption])
    messages: tuple[Message, ...] = (
        UserTurn("go"),
        AssistantTurn("", (ToolCall("call_0_0", "slow_tool", {}),)),
        ToolResult("call_0_0", "slow_tool", {"type": "interrupted", "message": "x"}, True),
    )
    assert text_of(await collect(model, request(*messages))) == "retrying the tool"


@pytest.mark.anyio
async def test_a_step_function_returning_something_else_is_a_type_error() -> None:
    def broken(req: ModelRequest) -> Any:
        return 42

    with pytest.raises(TypeError):
        await collect(ScriptedModel("m", broken), request())


# --- recording -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_every_request_is_recorded_even_failed_ones() -> None:
    model = ScriptedModel("m", [reply("one")])
    ok = request(UserTurn("a"))
    past_the_end = request(*history(1))
    await collect(model, ok)
    with pytest.raises(ProviderError):
        await collect(model, past_the_end)
    assert model.requests == [ok, past_the_end]


def test_the_size_estimate_counts_characters_as_sent_whatever_their_script() -> None:
    """Four characters a token, for Cyrillic and emoji as for ASCII: JSON's \\uXXXX escapes
    counted six (or twelve) for one and sent compaction off far too early."""
    for text in ("hello worl " * 600, "привет мир " * 600, "🙂🙃 word " * 600):
        as_result = request(UserTurn("q"), ToolResult("t1", "fetch", text), AssistantTurn("ok"))
        as_arguments = request(
            UserTurn("q"), AssistantTurn("", (ToolCall("t1", "put", {"text": text}),))
        )
        plain = request(UserTurn("q"), AssistantTurn("ok"))
        expected = len(text) // 4
        assert estimate_tokens(as_result) - estimate_tokens(plain) in range(expected, expected + 5)
        added = estimate_tokens(as_arguments) - estimate_tokens(plain)
        assert added in range(expected, expected + 10)


@pytest.mark.anyio
async def test_a_list_script_goes_on_after_a_compaction_instead_of_starting_over() -> None:
    """The summary call played the list's next step, and the turns after it counted only what
    the summary had left: a large tool result replayed the tool call for ever."""
    import hearth

    ran: list[int] = []

    @hearth.tool
    def big() -> str:
        """A large result."""
        ran.append(1)
        return "x" * 40_000  # ~10,000 tokens: more than the window below

    @hearth.agent
    def reader(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")
        ctx.use_tool(big)
        return "Read."

    model = ScriptedModel("m", [calls(call("big")), reply("done")], context_window=8192)
    app = hearth.App([reader], db="memory", providers=[model])
    async with app.run() as rt:
        answer = await rt.read(await rt.dispatch("reader", "c", "go"), timeout=20)
        kinds = [r.type for r in await rt.history("reader", "c")]
    assert answer.text == "done" and len(ran) == 1 and kinds.count("compaction") == 1
    assert [r.purpose for r in model.requests] == ["turn", "summary", "turn"]
    assert model.requests[-1].summary == "(scripted summary of 1 assistant turns)"
