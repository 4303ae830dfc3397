"""The in-process runtime: admission, the turn loop, tools, state, abort, deadlines, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import json
import random
import re
import string
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
import pydantic
import pytest
from leaky_library import leak_a_cancellation

import hearth
import hearth._tasks
from hearth.providers.base import (
    Finished,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
)
from hearth.receipts import Receipt
from hearth.records import (
    AssistantMessageCompleted,
    AssistantTextDelta,
    AssistantToolCall,
    Record,
    Signal,
    SubmissionSettled,
    ToolOutcome,
    ToolStepSettled,
    UserMessage,
)
from hearth.store import open_store
from hearth.testing import ScriptedModel, Step, call, calls, error, reply, stall, stream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def app_with(*agents: hearth.Agent, models: list[ScriptedModel], db: str = "memory") -> hearth.App:
    return hearth.App(list(agents), db=db, providers=models)


def simple_agent(
    model: str, *tools: hearth.Tool, name: str | None = None, **kw: Any
) -> hearth.Agent:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model(f"scripted/{model}")
        for t in tools:
            ctx.use_tool(t)
        return "system"

    return hearth.Agent(render, name=name or model, **kw)


def store_url(db: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The database for a test run on each store: ``sqlite``, ``memory`` or ``postgres``."""
    if db == "postgres":
        return str(request.getfixturevalue("pg_cluster").url())
    return f"sqlite:///{tmp_path / 'h.db'}" if db == "sqlite" else "memory"


def of(records: list[Record], kind: type[Record]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


def results(request: ModelRequest) -> list[ToolResult]:
    return [m for m in request.messages if isinstance(m, ToolResult)]


# --- admission and reading -------------------------------------------------------------------


async def test_dispatch_returns_a_receipt_and_read_returns_the_reply() -> None:
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("hello there")])])
    async with app.run() as rt:
        receipt = await rt.dispatch("a", "c-1", "hi")
        assert receipt.conversation_id == "a/c-1" and receipt.offset == 0
        reply_ = await rt.read(receipt, timeout=10)
    assert reply_ == hearth.Reply("hello there", receipt.submission_id, "completed")


async def test_a_runtime_used_from_another_event_loop_says_how_to_hand_it_the_call() -> None:
    """From another thread's event loop a dispatch was admitted but its wake-ups were set on
    the wrong loop's thread: the read never returned, though the submission had settled."""
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("hi")], repeat_last=True)])
    async with app.run() as rt:
        home = asyncio.get_running_loop()

        def elsewhere() -> str:
            try:
                asyncio.run(rt.dispatch("a", "c-1", "hi"))
            except RuntimeError as exc:
                return str(exc)
            return "accepted"

        said = await asyncio.to_thread(elsewhere)
        assert "run_coroutine_threadsafe" in said

        def handed() -> hearth.Reply:  # the way it says: the call runs on the runtime's loop
            async def ask() -> hearth.Reply:
                return await rt.read(await rt.dispatch("a", "c-2", "hi"), timeout=10)

            return asyncio.run_coroutine_threadsafe(ask(), home).result(20)

        assert (await asyncio.to_thread(handed)).text == "hi"


async def test_the_same_idempotency_key_and_payload_return_the_first_receipt() -> None:
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("one")], repeat_last=True)])
    async with app.run() as rt:
        first = await rt.dispatch("a", "c", "hi", idempotency_key="k1")
        await rt.read(first, timeout=10)
        again = await rt.dispatch("a", "c", "hi", idempotency_key="k1")
        assert again.submission_id == first.submission_id and again.deduplicated
        with pytest.raises(hearth.IdempotencyConflict):
            await rt.dispatch("a", "c", "something else", idempotency_key="k1")
        assert len(await rt.store.list_submissions("a/c")) == 1


@pytest.mark.parametrize(
    ("agent", "id", "message", "exc"),
    [
        ("nobody", "c", "hi", hearth.UnknownAgent),
        ("a", "bad id", "hi", hearth.InvalidId),
        ("a", "-x", "hi", hearth.InvalidId),
        ("a", "c", "", ValueError),
    ],
)
async def test_bad_input_is_refused_before_admission(
    agent: str, id: str, message: str, exc: type
) -> None:
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("x")])])
    async with app.run() as rt:
        with pytest.raises(exc):
            await rt.dispatch(agent, id, message)
        assert await rt.store.list_submissions() == []


async def test_an_idempotency_key_over_256_characters_is_refused() -> None:
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("x")])])
    async with app.run() as rt:
        with pytest.raises(ValueError, match="idempotency_key"):
            await rt.dispatch("a", "c", "hi", idempotency_key="k" * 257)


async def test_an_idempotency_key_of_hearths_own_form_is_refused() -> None:
    """A caller's key of a schedule occurrence's form, taken first, kept that occurrence out
    for good (the scheduler met a key with another payload at every tick)."""
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("x")])])
    async with app.run() as rt:
        for key in ("schedule:nightly:2026-12-06T02:30:00Z", "channel:github:d-1:0"):
            with pytest.raises(hearth.InvalidInput, match="hearth's own"):
                await rt.dispatch("a", "c", "hi", idempotency_key=key)
        assert await rt.store.list_submissions() == []
        assert (await rt.dispatch("a", "c", "hi", idempotency_key="my:schedule:1")).submission_id


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"message": "half an emoji \ud83d"}, "message"),
        ({"signal": {"type": "t", "body": "\udc00"}}, "signal"),
        ({"signal": {"type": "t", "attributes": {"k": "\ud800"}}}, "signal"),
        ({"message": "hi", "idempotency_key": "k\udfff"}, "idempotency_key"),
    ],
)
async def test_text_with_an_unpaired_surrogate_is_refused_before_admission(
    given: dict[str, Any], field: str
) -> None:
    """No UTF-8 text can hold half a surrogate pair: it is refused, naming the field, instead of
    failing inside the store."""
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("x")])])
    async with app.run() as rt:
        with pytest.raises(hearth.InvalidInput, match="surrogate") as info:
            await rt.dispatch("a", "c", **given)
        assert info.value.field == field
        assert await rt.store.list_submissions() == []


@pytest.mark.parametrize(
    "attributes", [{"x": {1, 2}}, {"x": float("nan")}, {"x": float("inf")}, {"x": object()}]
)
async def test_signal_attributes_that_are_not_json_are_refused_before_admission(
    attributes: dict[str, Any],
) -> None:
    """Through the Python API a signal's attributes could be anything: a set raised a bare
    TypeError from inside the store, and NaN was admitted and stored, after which every JSON
    read of the conversation's stream answered 500."""
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("x")])])
    async with app.run() as rt:
        with pytest.raises(hearth.InvalidInput, match=r"signal\.attributes must be JSON") as info:
            await rt.dispatch("a", "c", signal={"type": "t", "attributes": attributes})
        assert info.value.field == "signal.attributes"
        assert await rt.store.list_submissions() == []
        # Keys JSON turns into strings are stored as JSON gives them back.
        receipt = await rt.dispatch("a", "d", signal={"type": "t", "attributes": {1: (2, 3)}})
        await rt.read(receipt, timeout=10)
        [signal] = of(await rt.history("a", "d"), Signal)
        assert signal.attributes == {"1": [2, 3]}


@pytest.mark.parametrize("db", ["sqlite", "memory", "postgres"])
async def test_a_tool_result_and_a_reply_with_unpaired_surrogates_keep_replacement_characters(
    tmp_path: Path, db: str, request: pytest.FixtureRequest
) -> None:
    """A tool may return, and a model may stream, half a surrogate pair (an emoji cut between two
    chunks), or a NUL. The work completes: what is stored has U+FFFD for the half pair (it has
    no UTF-8 form) and, in the reply, for the NUL (PostgreSQL's text refuses it). Before, the
    attempt failed at the store again and again, or never settled."""

    @hearth.tool
    def cut() -> str:
        """Return text whose emoji was cut in half."""
        return "half an emoji: \ud83d, a NUL: \x00"

    model = ScriptedModel("a", [calls(call("cut")), reply("done \udc00 too \x00")])
    url = store_url(db, tmp_path, request)
    async with app_with(simple_agent("a", cut), models=[model], db=url).run() as rt:
        answer = await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)
        assert (answer.outcome, answer.text) == ("completed", "done \ufffd too \ufffd")
        records = await rt.history("a", "c")
        # Inside JSON a NUL is the escape \u0000, which every store keeps.
        assert [o.content for o in of(records, ToolOutcome)] == [
            "half an emoji: \ufffd, a NUL: \x00"
        ]
        assert of(records, SubmissionSettled)[0].reply == "done \ufffd too \ufffd"
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]  # no crash, no retry


@pytest.mark.parametrize("db", ["sqlite", "memory", "postgres"])
async def test_tool_call_ids_no_store_can_keep_or_given_twice_are_recorded_under_their_own_ids(
    tmp_path: Path, db: str, request: pytest.FixtureRequest
) -> None:
    """A provider's tool-call id becomes part of record ids, which the stores keep as plain text:
    a NUL (PostgreSQL), half a surrogate pair (any store), an empty id, or one id given to two
    calls of a message made every attempt fail at the store, until the retry budget ran out.
    Each call is now recorded under an id of its own, and the turn completes at once."""

    @hearth.tool
    def echo(n: int) -> str:
        """Echo a number."""
        return f"got {n}"

    seen: list[ModelRequest] = []

    def script(req: ModelRequest) -> Step:
        seen.append(req)
        if results(req):
            return reply("done")
        ids = ["a\x00b", "c\ud800d", "", "same", "same", "same_2"]
        return calls(*(call("echo", n=i, id=given) for i, given in enumerate(ids)))

    model = ScriptedModel("a", script)
    url = store_url(db, tmp_path, request)
    async with app_with(simple_agent("a", echo), models=[model], db=url).run() as rt:
        answer = await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)
        assert (answer.outcome, answer.text) == ("completed", "done")
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]
        outcomes = of(await rt.history("a", "c"), ToolOutcome)
    # The calls run at once, so their outcomes may be recorded in any order.
    by_call = {o.content: o.tool_call_id for o in outcomes}
    ids = [by_call[f"got {n}"] for n in range(6)]
    assert ids[:2] == ["a\ufffdb", "c\ufffdd"]
    assert ids[2].startswith("call_")
    assert ids[3:] == ["same", "same_2", "same_2_2"]
    # The next request names each call's result by the id its call was recorded under.
    assert sorted(r.tool_call_id for r in results(seen[-1])) == sorted(ids)


async def test_submissions_of_one_conversation_run_one_at_a_time_in_admission_order() -> None:
    model = ScriptedModel(
        "a", lambda req: stream("re: ", str(req.messages[-1].content), delay=0.02)
    )  # type: ignore[union-attr]
    app = app_with(simple_agent("a"), models=[model])
    async with app.run() as rt:
        receipts = [await rt.dispatch("a", "c", f"m{i}") for i in range(4)]
        replies = [await rt.read(r, timeout=10) for r in receipts]
        history = await rt.history("a", "c")
    assert [r.text for r in replies] == ["re: m0", "re: m1", "re: m2", "re: m3"]
    kinds = [r.type for r in history if r.type in ("user_message", "submission_settled")]
    assert kinds == ["user_message", "submission_settled"] * 4


async def test_different_conversations_run_concurrently() -> None:
    both_inside = asyncio.Event()
    inside = 0

    @hearth.tool
    async def meet() -> str:
        """Wait for the other conversation."""
        nonlocal inside
        inside += 1
        if inside == 2:
            both_inside.set()
        await asyncio.wait_for(both_inside.wait(), 5)
        return "met"

    model = ScriptedModel("a", [calls(call("meet")), reply("done")])
    app = app_with(simple_agent("a", meet), models=[model])
    async with app.run() as rt:
        r1 = await rt.dispatch("a", "c1", "go")
        r2 = await rt.dispatch("a", "c2", "go")
        assert (await rt.read(r1, timeout=10)).text == "done"
        assert (await rt.read(r2, timeout=10)).text == "done"


# --- tools -----------------------------------------------------------------------------------


@hearth.tool
async def leaky() -> str:
    """Call a library that leaks a cancellation."""
    await leak_a_cancellation()
    return "never"


@hearth.tool(durable=True)
async def leaky_durable(ctx: hearth.ToolContext) -> str:
    """The same, in a durable tool's step."""
    await ctx.step.do("first", lambda: 1)
    await leak_a_cancellation()
    return "never"


@pytest.mark.parametrize("tool", [leaky, leaky_durable])
async def test_a_cancellation_the_tool_raises_itself_fails_the_call_not_the_attempt(
    tool: hearth.Tool,
) -> None:
    """Taken for hearth stopping the call, it ended the attempt: an ordinary call was marked
    interrupted on recovery, and a durable one ran again, leaked again, until the attempts ran
    out. Nothing cancelled the call, so it is the tool's failure, reported in attempt 1."""
    model = ScriptedModel("a", [calls(call(tool.name)), reply("done")])
    async with app_with(simple_agent("a", tool), models=[model]).run() as rt:
        answer = await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)
        assert answer.text == "done"
        [outcome] = of(await rt.history("a", "c"), ToolOutcome)
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]
    assert outcome.is_error and outcome.content["type"] == "exception"
    assert "CancelledError" in outcome.content["message"]


class Address(pydantic.BaseModel):
    city: str
    zip: str


@hearth.tool
def ship(
    order_id: Annotated[str, pydantic.Field(description="The order to ship")],
    to: Address,
    express: bool = False,
) -> Address:
    """Ship an order."""
    return Address(city=to.city.upper(), zip=to.zip)


def test_a_tool_schema_comes_from_its_signature() -> None:
    spec = ship.spec()
    assert spec.name == "ship" and spec.description == "Ship an order."
    props = spec.parameters["properties"]
    assert props["order_id"]["description"] == "The order to ship"
    assert props["express"]["default"] is False
    assert spec.parameters["required"] == ["order_id", "to"]


async def test_tool_results_validation_errors_and_exceptions_are_outcomes_the_model_sees() -> None:
    runs = []

    @hearth.tool
    async def explode() -> None:
        """Fail."""
        runs.append("explode")
        raise RuntimeError("boom")

    def script(request: ModelRequest) -> Step:
        if not results(request):
            return calls(
                call("ship", order_id="7", to={"city": "oslo", "zip": "0150"}),
                call("ship", order_id="8"),
                call("explode"),
                call("missing"),
            )
        return reply(
            ";".join(
                f"{r.name}:{r.content['type'] if r.is_error else r.content}"
                for r in results(request)
            )
        )

    app = app_with(simple_agent("a", ship, explode), models=[ScriptedModel("a", script)])
    async with app.run() as rt:
        reply_ = await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)
        outcomes = of(await rt.history("a", "c"), ToolOutcome)
    assert reply_.text == (
        "ship:{'city': 'OSLO', 'zip': '0150'};ship:validation;"
        "explode:exception;missing:unknown_tool"
    )
    assert runs == ["explode"]  # an exception is not retried
    by_call = {o.tool_call_id: o for o in outcomes}  # appended as each call finished
    assert by_call["call_0_2"].content["message"] == "RuntimeError: boom"
    assert "to" in by_call["call_0_1"].content["message"]


async def test_step_names_must_be_unique_non_empty_and_values_json() -> None:
    @hearth.tool(durable=True)
    async def misuse(how: str, ctx: hearth.ToolContext) -> str:
        """Break step rules."""
        if how == "reuse":
            await ctx.step.do("a", lambda: 1)
            await ctx.step.do("a", lambda: 2)
        elif how == "empty":
            await ctx.step.do("", lambda: 1)
        else:
            await ctx.step.do("obj", lambda: object())
        return "unreachable"

    model = ScriptedModel(
        "a",
        [
            calls(
                call("misuse", how="reuse"), call("misuse", how="empty"), call("misuse", how="json")
            ),
            lambda req: reply(" | ".join(r.content["message"] for r in results(req))),
        ],
    )
    app = app_with(simple_agent("a", misuse), models=[model])
    async with app.run() as rt:
        text = (await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)).text
    assert "already used" in text and "non-empty" in text and "not JSON" in text


async def test_a_step_returns_the_json_form_of_its_value() -> None:
    """What a step returns is its JSON form, the same on the first run as on a replay: plain
    values as they are, anything else through a JSON round trip (an IntEnum becomes an int)."""

    class Level(enum.IntEnum):
        HIGH = 3

    seen: list[list[Any]] = []

    @hearth.tool(durable=True)
    async def values(ctx: hearth.ToolContext) -> str:
        """Return values of several kinds from steps."""
        got = [
            await ctx.step.do("int", lambda: 7),
            await ctx.step.do("text", lambda: "é"),
            await ctx.step.do("flag", lambda: True),
            await ctx.step.do("none", lambda: None),
            await ctx.step.do("enum", lambda: Level.HIGH),
            await ctx.step.do("tuple", lambda: (1, "a")),
            await ctx.step.do("float", lambda: 0.5),
            await ctx.step.do("cut", lambda: "cut \ud83d"),
            await ctx.step.do("cuts", lambda: ["\ud83d", {"k": "\ude00"}]),
        ]
        seen.append([(type(v).__name__, v) for v in got])
        return "ok"

    model = ScriptedModel("a", [calls(call("values")), reply("done")])
    app = app_with(simple_agent("a", values), models=[model])
    async with app.run() as rt:
        assert (await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)).text == "done"
        stored = [r.value for r in of(await rt.history("a", "c"), ToolStepSettled)]
    assert seen == [
        [
            ("int", 7),
            ("str", "é"),
            ("bool", True),
            ("NoneType", None),
            ("int", 3),
            ("list", [1, "a"]),
            ("float", 0.5),
            ("str", "cut \ufffd"),  # half a surrogate pair: kept, and so replayed, as U+FFFD
            ("list", ["\ufffd", {"k": "\ufffd"}]),
        ]
    ]
    assert stored == [v for _, v in seen[0]]  # what a replay returns


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [10**5000, _nested(100_000)],
    ids=["an int of 5,001 digits", "a list nested 100,000 deep"],
)
async def test_a_step_value_json_cannot_hold_raises_step_error(value: Any) -> None:
    """An int of more digits than Python prints raised ValueError from inside the store's
    encoder, and a list too deep to encode RecursionError, not StepError as documented."""
    raised: list[BaseException] = []

    @hearth.tool(durable=True)
    async def keep(ctx: hearth.ToolContext) -> str:
        """Keep a value."""
        try:
            await ctx.step.do("v", lambda: value)
        except BaseException as exc:
            raised.append(exc)
        return "ok"

    model = ScriptedModel("a", [calls(call("keep")), reply("done")])
    async with app_with(simple_agent("a", keep), models=[model]).run() as rt:
        assert (await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)).text == "done"
    assert len(raised) == 1 and isinstance(raised[0], hearth.StepError), raised


def test_a_durable_tool_needs_a_tool_context_parameter() -> None:
    def plain(x: int) -> int:
        return x

    with pytest.raises(hearth.ConfigurationError, match="ToolContext"):
        hearth.tool(durable=True)(plain)


def test_agent_names_default_from_the_function_and_must_be_valid() -> None:
    def customer_support(ctx: hearth.AgentContext) -> str:
        return ""

    assert hearth.agent(customer_support).name == "customer-support"
    with pytest.raises(hearth.ConfigurationError):
        hearth.Agent(customer_support, name="Bad_Name")
    with pytest.raises(TypeError):
        hearth.Durability(max_attempt=3)  # type: ignore[call-arg]


class _Shop:
    def lookup(self, order_id: str) -> str:
        return order_id


def _sync_durable(ctx: hearth.ToolContext) -> int:
    return 1


def _positional_only(a: int, /) -> int:
    return a


def _two_contexts(a: hearth.ToolContext, b: hearth.ToolContext) -> int:
    return 1


def _underscore(_x: int) -> int:
    return _x


def _pydantic_name(model_config: int) -> int:
    return model_config


def _callable_param(fn: Callable[[int], int]) -> int:
    return fn(1)


def _nan_default(x: float = float("nan")) -> float:
    return x


def _odd_description(x: int) -> int:
    """Half \ud83d of a pair."""
    return x


def _odd_field(x: Annotated[int, pydantic.Field(description="half \udc00")]) -> int:
    return x


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (_odd_description, "unpaired surrogate U+D83D"),
        (_odd_field, "unpaired surrogate U+DC00"),
        (_positional_only, "positional-only"),
        (_two_contexts, "one parameter may take hearth.ToolContext"),
        (_underscore, "start with _ or model_"),
        (_pydantic_name, "start with _ or model_"),
        (_callable_param, "no JSON schema"),
        (_nan_default, "no JSON schema"),
        (functools.partial(_underscore, 1), "tool name None"),
        (_Shop.lookup, "not a method; the model cannot give 'self'"),
        (_sync_durable, "must be an async function"),
    ],
)
def test_a_tool_no_model_could_call_is_refused_when_declared(fn: Any, says: str) -> None:
    """Each was accepted: a schema pydantic could not make failed every turn as a runtime bug
    (until the attempts ran out, naming no tool); the others were told to the model wrongly
    (an argument left out, an empty schema, a NaN default, ``self``) and every call failed,
    or (a sync durable tool) its steps never ran."""
    with pytest.raises(hearth.ConfigurationError, match=re.escape(says)):
        if fn is _sync_durable:
            hearth.tool(durable=True)(fn)
        else:
            hearth.tool(fn)


def _lookup(order_id: str, region: str) -> str:
    return f"{order_id}@{region}"


class _Lookup:
    def __call__(self, order_id: str, ctx: hearth.ToolContext | None = None) -> str:
        return order_id


def test_partials_and_callable_objects_are_described_by_what_the_model_gives() -> None:
    """``get_type_hints`` refused both; what a partial fixes is not the model's to choose, and
    ``Optional[ToolContext]`` is the context too."""
    for fn in (functools.partial(_lookup, region="eu"), _Lookup()):
        declared = hearth.tool(name="lookup")(fn)
        assert declared.spec().parameters["properties"].keys() == {"order_id"}
    assert hearth.tool(name="lookup")(_Lookup()).context_param == "ctx"


async def _charge(amount: int, ctx: hearth.ToolContext) -> int:
    return int(await ctx.step.do("charge", lambda: amount))


def test_options_given_with_the_function_are_honoured() -> None:
    """``hearth.tool(fn, durable=True, name=...)`` dropped every option: a tool declared
    durable ran as an ordinary one (its ``ctx.step`` refused), and a partial had no name."""
    charge = hearth.tool(_charge, durable=True, name="charge_card", description="Charge.")
    assert (charge.durable, charge.name, charge.description) == (True, "charge_card", "Charge.")
    assert hearth.tool(functools.partial(_lookup, region="eu"), name="lookup").name == "lookup"


class _Order(pydantic.BaseModel):
    id: str


async def test_pydantic_models_inside_a_tools_result_are_dumped() -> None:
    @hearth.tool
    async def orders() -> dict[str, list[_Order]]:
        """All orders."""
        return {"open": [_Order(id="7"), _Order(id="8")]}

    ctx: Any = None
    assert await orders.invoke({}, ctx) == {"open": [{"id": "7"}, {"id": "8"}]}


def test_durability_takes_only_what_the_stores_can_keep() -> None:
    """NaN passed ``timeout <= 0`` and failed every admission at the store (a 503); huge
    values raised OverflowError from inside it (a 500)."""
    for bad in (
        {"timeout": float("nan")},
        {"timeout": float("inf")},
        {"timeout": 10**400},
        {"timeout": True},
        {"max_attempts": 10**30},
        {"max_attempts": True},
    ):
        with pytest.raises(hearth.ConfigurationError, match="Durability"):
            hearth.Durability(**bad)
    assert hearth.Durability(max_attempts=2**31 - 1, timeout=86400 * 365).max_attempts == 2**31 - 1


async def test_a_tool_named_task_beside_subagents_is_refused_when_rendered() -> None:
    """Every call named task went to the subagents (the tool never ran), and the model was
    offered two tools of that name."""

    @hearth.tool
    def task(what: str) -> str:
        """Note a task."""
        return what

    helper = simple_agent("h")

    @hearth.agent
    def planner(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/p")
        ctx.use_tool(task)
        ctx.use_subagent(helper, description="helps")
        return ""

    async with app_with(planner, helper, models=[ScriptedModel("p", [reply("x")])]).run() as rt:
        with pytest.raises(hearth.SubmissionFailed, match="rename its own tool 'task'"):
            await rt.read(await rt.dispatch("planner", "c", "go"), timeout=10)


# --- state -----------------------------------------------------------------------------------


async def test_state_set_to_an_equal_python_value_of_another_json_is_written() -> None:
    """0 == False and 1 == 1.0 in Python: the second write was taken for the current value and
    dropped, and the state stayed 0."""

    @hearth.agent
    def flagger(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/f")
        _, set_flag = ctx.use_state("flag", None)

        @hearth.tool
        def flag(to: Any) -> str:
            """Set the flag."""
            set_flag(to)
            return "set"

        ctx.use_tool(flag)
        return ""

    model = ScriptedModel(
        "f", [calls(call("flag", to=0)), calls(call("flag", to=False)), reply("ok")]
    )
    async with app_with(flagger, models=[model]).run() as rt:
        await rt.read(await rt.dispatch("flagger", "c", "go"), timeout=10)
        assert await rt.store.get_state("flagger/c") == {"flag": False}
        flags = [r.value for r in await rt.history("flagger", "c") if r.type == "state_write"]
    assert flags == [0, False] and type(flags[1]) is bool


async def test_state_set_after_its_tool_returned_is_refused_not_lost() -> None:
    """A task the tool left running set state after the tool's writes were committed: nothing
    was stored and nothing said so."""
    late: list[str] = []
    done = asyncio.Event()

    @hearth.agent
    def counter(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/c")
        _, set_count = ctx.use_state("count", 0)

        async def later() -> None:
            await asyncio.sleep(0.05)
            try:
                set_count(99)
            except hearth.HearthError as exc:
                late.append(str(exc))
            done.set()

        @hearth.tool
        async def bump() -> str:
            """Start counting."""
            asyncio.get_running_loop().create_task(later())
            return "started"

        ctx.use_tool(bump)
        return ""

    model = ScriptedModel("c", [calls(call("bump")), reply("ok")])
    async with app_with(counter, models=[model]).run() as rt:
        await rt.read(await rt.dispatch("counter", "c", "go"), timeout=10)
        await asyncio.wait_for(done.wait(), 10)
    assert late and "after its tool call or event hook ended" in late[0]


async def test_state_written_by_a_tool_is_visible_to_the_next_render() -> None:
    @hearth.agent
    def counter(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/counter")
        n, set_n = ctx.use_state("n", 0)

        @hearth.tool
        def incr() -> int:
            """Increment."""
            set_n(n + 1)
            set_n(n + 1)  # the same value twice is one write
            return n + 1

        ctx.use_tool(incr)
        return f"n={n}"

    model = ScriptedModel(
        "counter", [calls(call("incr")), lambda req: reply(req.system)], repeat_last=False
    )
    app = app_with(counter, models=[model])
    async with app.run() as rt:
        assert (await rt.read(await rt.dispatch("counter", "c", "go"), timeout=10)).text == "n=1"
        assert await rt.store.get_state("counter/c") == {"n": 1}
        writes = [r for r in await rt.history("counter", "c") if r.type == "state_write"]
        assert len(writes) == 1


async def test_state_changed_in_place_and_set_again_is_written_each_time() -> None:
    """The value handed out was the committed one itself: appended to and set, it compared
    equal to itself, and every write after the first was dropped."""

    @hearth.agent
    def notes(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/notes")
        items, set_items = ctx.use_state("items", [])

        @hearth.tool
        def remember(note: str) -> list[str]:
            """Remember a note."""
            items.append(note)
            set_items(items)
            return list(items)

        ctx.use_tool(remember)
        return f"notes: {items}"

    def script(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if isinstance(last, ToolResult):
            return reply(request.system)
        return calls(call("remember", note=str(last.content)))  # type: ignore[union-attr]

    app = app_with(notes, models=[ScriptedModel("notes", script)])
    async with app.run() as rt:
        for note in ("milk", "eggs", "bread"):
            await rt.read(await rt.dispatch("notes", "c", note), timeout=10)
        assert await rt.store.get_state("notes/c") == {"items": ["milk", "eggs", "bread"]}
        writes = [r for r in await rt.history("notes", "c") if r.type == "state_write"]
        assert len(writes) == 3


async def test_setting_state_during_render_fails_the_submission_clearly() -> None:
    @hearth.agent
    def eager(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/eager")
        _, set_flag = ctx.use_state("flag", False)
        set_flag(True)
        return ""

    app = app_with(eager, models=[ScriptedModel("eager", [reply("x")])])
    async with app.run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as info:
            await rt.read(await rt.dispatch("eager", "c", "go"), timeout=10)
    assert info.value.type == "agent_error"
    assert "while eager was rendering" in str(info.value)


async def test_state_set_to_a_value_that_is_not_json_fails_that_tool_call_clearly() -> None:
    """The setter refuses it inside the tool (an error outcome the model reads), and a JSON value
    is kept as JSON gives it back. Before, the batch's commit failed and the attempt crashed."""

    @hearth.agent
    def keeper(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/keeper")
        _, set_tags = ctx.use_state("tags", [])

        @hearth.tool
        def tag(bad: bool) -> str:
            """Set the tags."""
            set_tags({"a", "b"} if bad else ("a", "b"))
            return "tagged"

        ctx.use_tool(tag)
        return ""

    model = ScriptedModel(
        "keeper",
        [calls(call("tag", bad=True)), calls(call("tag", bad=False)), reply("ok")],
    )
    async with app_with(keeper, models=[model]).run() as rt:
        assert (await rt.read(await rt.dispatch("keeper", "c", "go"), timeout=10)).text == "ok"
        first, second = of(await rt.history("keeper", "c"), ToolOutcome)
        assert first.is_error and "state 'tags' must be set to a JSON value" in str(first.content)
        assert not second.is_error
        assert await rt.store.get_state("keeper/c") == {"tags": ["a", "b"]}
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]


LONG = "".join(random.Random(7).choices(string.ascii_letters, k=3000))  # hardly compressible


@pytest.mark.parametrize("db", ["sqlite", "memory", "postgres"])
@pytest.mark.parametrize("name", ["bad\x00name", LONG[:257]])
async def test_a_step_name_no_store_can_keep_is_refused_in_the_tool(
    tmp_path: Path, db: str, name: str, request: pytest.FixtureRequest
) -> None:
    """A NUL, or more than 256 characters (a step's name is part of its record's id, a unique
    index's key, and PostgreSQL's hold at most 2,704 bytes): refused in the call on every store
    alike. A long name used to stall its call on PostgreSQL for the whole write-retry budget and
    fail it as the store being unreachable; SQLite took it."""

    @hearth.tool(durable=True)
    async def stepper(ctx: hearth.ToolContext) -> str:
        """Take a step with a name no store can keep."""
        await ctx.step.do(name, lambda: 1)
        return "stepped"

    @hearth.tool(durable=True)
    async def longest(ctx: hearth.ToolContext) -> str:
        """Take a step with the longest name there may be."""
        return str(await ctx.step.do(LONG[:256], lambda: "kept"))

    model = ScriptedModel("a", [calls(call("stepper"), call("longest")), reply("ok")])
    url = store_url(db, tmp_path, request)
    async with app_with(simple_agent("a", stepper, longest), models=[model], db=url).run() as rt:
        assert (await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)).text == "ok"
        kept, refused = sorted(of(await rt.history("a", "c"), ToolOutcome), key=lambda o: o.name)
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]
    assert (refused.name, refused.is_error) == ("stepper", True)
    assert "a step name must be a non-empty string of at most 256 characters" in str(
        refused.content
    )
    assert (kept.name, kept.is_error, kept.content) == ("longest", False, "kept")


async def test_a_step_or_wait_name_of_hearths_own_is_refused_and_a_recorded_one_replays() -> None:
    """A step named ``hearth.sets:pay`` was left out of the recorded steps (hearth's
    bookkeeping name) and ran again after a crash; beside a step ``pay`` that set state, its
    record took the bookkeeping record's id (an IntegrityError reached the model)."""
    from hearth.steps import Steps

    recorded: list[str] = []

    async def record(name: str, value: Any, gathered: Any) -> None:
        recorded.append(name)

    steps = Steps("call", {"hearth.old": "kept"}, record)
    for name in ("hearth.sets:pay", "hearth.rerun", "hearth."):
        with pytest.raises(hearth.StepError, match="hearth's own"):
            await steps.do(name, lambda: "ran")
    with pytest.raises(hearth.StepError, match="hearth's own"):
        await steps.wait("hearth.approval")
    assert await steps.do("hearth.old", lambda: "ran again") == "kept"  # (recorded: replays)
    assert await steps.do("hearthy", lambda: "ran") == "ran"
    assert recorded == ["hearthy"]


async def test_a_long_step_name_recorded_before_the_limit_still_replays() -> None:
    """A durable call re-executed after an upgrade replays its recorded steps, whatever their
    names: a name over 256 characters, recorded on SQLite before names had a limit, returns its
    value (the function does not run) instead of failing the call."""
    from hearth.steps import Steps

    async def record(name: str, value: Any, sets: Any) -> None:
        raise AssertionError("a recorded step is not recorded again")

    steps = Steps("call", {LONG[:300]: "kept"}, record)
    assert await steps.do(LONG[:300], lambda: "ran again") == "kept"
    with pytest.raises(hearth.StepError, match="at most 256 characters"):
        await steps.do(LONG[:301], lambda: "new")


async def test_a_state_name_over_256_characters_is_refused_when_rendering() -> None:
    @hearth.agent
    def keeper(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/a")
        ctx.use_state(LONG[:257])
        return ""

    model = ScriptedModel("a", [reply("never")])
    async with app_with(keeper, models=[model]).run() as rt:
        with pytest.raises(hearth.SubmissionFailed, match="at most 256 characters"):
            await rt.read(await rt.dispatch("keeper", "c", "go"), timeout=10)


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_tool_call_id_over_128_characters_is_recorded_cut_with_a_digest(
    tmp_path: Path, db: str, request: pytest.FixtureRequest
) -> None:
    """A provider's tool-call id becomes part of record ids (unique index keys): one of 3,000
    characters is recorded as its first 111 and a digest of the whole, so two long ids that
    share their start stay apart."""

    @hearth.tool
    def echo(n: int) -> str:
        """Echo a number."""
        return f"got {n}"

    ids = [LONG, LONG[:2999] + "!"]
    model = ScriptedModel(
        "a", [calls(*(call("echo", n=i, id=given) for i, given in enumerate(ids))), reply("ok")]
    )
    url = store_url(db, tmp_path, request)
    async with app_with(simple_agent("a", echo), models=[model], db=url).run() as rt:
        assert (await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)).text == "ok"
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]
        outcomes = of(await rt.history("a", "c"), ToolOutcome)
    recorded = {o.content: o.tool_call_id for o in outcomes}
    first, second = recorded["got 0"], recorded["got 1"]
    assert len(first) == len(second) == 128 and first != second
    assert first[:111] == second[:111] == LONG[:111] and first[111] == "_"


class Reading(pydantic.BaseModel):
    celsius: float


async def test_nan_from_a_step_a_tool_or_state_is_an_error_outcome_not_a_stored_value() -> None:
    """NaN has no JSON form: stored, every HTTP read of the stream answered 500. Each way it can
    come from the app is refused in its tool call, and the stream stays strict JSON."""

    @hearth.agent
    def calc(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/calc")
        _, set_ratio = ctx.use_state("ratio", 0.0)

        @hearth.tool(durable=True)
        async def stepped(ctx: hearth.ToolContext) -> float:
            """A step that returns NaN."""
            return float(await ctx.step.do("ratio", lambda: float("nan")))

        @hearth.tool
        def returned() -> float:
            """Return infinity."""
            return float("inf")

        @hearth.tool
        def stored() -> str:
            """Keep NaN in state."""
            set_ratio(float("nan"))
            return "kept"

        @hearth.tool
        def modelled() -> Reading:
            """Return a model with a NaN field (pydantic dumps it as a float, NaN still)."""
            return Reading(celsius=float("nan"))

        for t in (stepped, returned, stored, modelled):
            ctx.use_tool(t)
        return ""

    model = ScriptedModel(
        "calc",
        [calls(call("stepped"), call("returned"), call("stored"), call("modelled")), reply("ok")],
    )
    async with app_with(calc, models=[model]).run() as rt:
        assert (await rt.read(await rt.dispatch("calc", "c", "go"), timeout=10)).text == "ok"
        records = await rt.history("calc", "c")
        outcomes = {o.name: o for o in of(records, ToolOutcome)}
        assert all(o.is_error for o in outcomes.values())
        assert "not JSON" in str(outcomes["stepped"].content)
        assert "not JSON" in str(outcomes["returned"].content)
        assert "JSON value" in str(outcomes["stored"].content)
        assert "not JSON" in str(outcomes["modelled"].content)
        json.dumps([r.to_json() for r in records], allow_nan=False)  # what the server sends
        assert await rt.store.get_state("calc/c") == {}


# --- abort, deadlines, provider errors --------------------------------------------------------


async def test_abort_settles_running_and_queued_work_aborted() -> None:
    model = ScriptedModel("a", [stall(after_chunks=["thinking"])], repeat_last=True)
    app = app_with(simple_agent("a"), models=[model])
    async with app.run() as rt:
        running = await rt.dispatch("a", "c", "first")
        queued = await rt.dispatch("a", "c", "second")
        while not any(isinstance(r, AssistantTextDelta) for r in await rt.history("a", "c")):
            await asyncio.sleep(0.01)
        result = await rt.abort("a", "c")
        assert result.aborted and set(result.submission_ids) == {
            running.submission_id,
            queued.submission_id,
        }
        for receipt in (running, queued):
            with pytest.raises(hearth.SubmissionAborted):
                await rt.read(receipt, timeout=10)
        history = await rt.history("a", "c")
    assert len(model.requests) == 1  # the queued one did no model work
    assert len(of(history, UserMessage)) == 1
    assert [s.signal_type for s in of(history, Signal)] == [
        "submission_aborted",
        "submission_aborted",
    ]
    closed = [r for r in history if r.type == "assistant_message_completed"]
    assert closed[0].stop_reason == "aborted" and closed[0].text == "thinking"


async def test_abort_after_completion_keeps_it_completed() -> None:
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("done")])])
    async with app.run() as rt:
        receipt = await rt.dispatch("a", "c", "go")
        await rt.read(receipt, timeout=10)
        result = await rt.abort("a", "c")
        assert not result.aborted and result.submission_ids == []
        assert (await rt.read(receipt)).text == "done"


async def test_the_deadline_is_enforced_on_running_work() -> None:
    agent = simple_agent("a", durability=hearth.Durability(timeout=0.5))
    app = app_with(agent, models=[ScriptedModel("a", [stall()])])
    async with app.run() as rt:
        receipt = await rt.dispatch("a", "c", "go")
        with pytest.raises(hearth.SubmissionFailed) as info:
            await rt.read(receipt, timeout=10)
    assert info.value.type == "timeout"


async def test_a_deadline_whose_timer_fired_holds_though_the_store_clock_reads_behind() -> None:
    """The concluding run asked the store's clock again; read a little behind (PostgreSQL's,
    re-measured from a round trip's middle), it said the deadline had not passed, started a
    new turn no timer watched, and the submission ran for good."""
    agent = simple_agent("a", durability=hearth.Durability(timeout=0.5))
    app = app_with(agent, models=[ScriptedModel("a", [stall()])])
    async with app.run() as rt:
        real_now, reads = rt.store.now, 0

        async def behind() -> float:
            nonlocal reads
            reads += 1
            return await real_now() - (0 if reads == 1 else 2.0)

        rt.store.now = behind  # type: ignore[method-assign]
        receipt = await rt.dispatch("a", "c", "go")
        with pytest.raises(hearth.SubmissionFailed) as info:
            await rt.read(receipt, timeout=10)
    assert info.value.type == "timeout"


async def test_a_shutdown_stops_the_run_that_concludes_a_deadline(tmp_path: Path) -> None:
    """That run (here asking a reconcile at rest) was no claim's work: the shutdown waited
    HEARTH_SHUTDOWN_S for it, then released it as after a crash."""
    asking = asyncio.Event()

    async def slow_answer(call: hearth.ReconcileCall) -> None:
        asking.set()
        await asyncio.sleep(60)

    @hearth.tool(reconcile=slow_answer, reconcile_timeout=120)
    async def pay() -> str:
        """Pay."""
        await asyncio.sleep(60)
        return "paid"

    agent = simple_agent("a", pay, durability=hearth.Durability(timeout=0.5))
    model = ScriptedModel("a", [calls(call("pay")), reply("done")])
    app = hearth.App([agent], db=f"sqlite:///{tmp_path / 'h.db'}", providers=[model])
    app.configure(shutdown_s=0.5)
    async with app.run() as rt:
        receipt = await rt.dispatch("a", "c", "go")
        await asyncio.wait_for(asking.wait(), 10)
    async with app.run() as rt:
        sub = await rt.submission(receipt.submission_id)
    assert sub.outcome is None and (sub.releases, sub.interruptions) == (1, 0)


@pytest.mark.parametrize("db", ["sqlite", "memory", "postgres"])
async def test_a_read_still_waiting_when_the_runtime_stops_raises_shutting_down(
    tmp_path: Path, db: str, request: pytest.FixtureRequest
) -> None:
    """A read pending when ``app.run()`` ended was never woken: it waited for good."""
    app = app_with(
        simple_agent("a"),
        models=[ScriptedModel("a", [stall()])],
        db=store_url(db, tmp_path, request),
    )
    async with app.run() as rt:
        receipt = await rt.dispatch("a", "c", "go")
        reader = asyncio.create_task(rt.read(receipt))
        timed = asyncio.create_task(rt.read(receipt, timeout=60))
        await asyncio.sleep(0.2)  # both wait for the settlement
    for waiting in (reader, timed):
        with pytest.raises(hearth.ShuttingDown, match="stopped before submission"):
            await asyncio.wait_for(waiting, 10)
    # And one asked afterwards, of the closed store ("the SQLite store is not open" before),
    # not told the submission did not settle: the stopped runtime cannot tell.
    for timeout in (None, 0, 5):
        with pytest.raises(hearth.ShuttingDown, match="cannot tell whether submission"):
            await rt.read(receipt, timeout=timeout)


async def test_transient_provider_errors_are_retried_then_succeed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hearth.runtime.recovery.BACKOFF_BASE_S", 0.01)
    attempts = 0

    def script(request: ModelRequest) -> Step:
        nonlocal attempts
        attempts += 1
        return error("transient", "503 overloaded") if attempts <= 2 else reply("finally")

    app = app_with(simple_agent("a"), models=[ScriptedModel("a", script)])
    async with app.run() as rt:
        assert (await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)).text == "finally"
    assert attempts == 3


async def test_the_reply_after_a_cut_stream_is_the_whole_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cut stream is continued from its saved part: the reply (``read``, the settled record)
    was the continuation alone, " is Paris.", not the answer the reader saw stream in."""
    monkeypatch.setattr("hearth.runtime.recovery.BACKOFF_BASE_S", 0.01)
    script = [
        reply("Hello."),
        error("transient", "connection reset", after_chunks=["The capital ", "of France"]),
        reply(" is Paris."),
    ]
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", script)])
    async with app.run() as rt:
        assert (await rt.read(await rt.dispatch("a", "c", "hi"), timeout=10)).text == "Hello."
        receipt = await rt.dispatch("a", "c", "capital?")
        answer = await rt.read(receipt, timeout=10)
        history = await rt.history("a", "c")
    assert answer.text == "The capital of France is Paris."
    assert [s.signal_type for s in of(history, Signal)] == ["stream_interrupted"]
    assert of(history, SubmissionSettled)[-1].reply == "The capital of France is Paris."


async def test_the_reply_goes_on_from_a_cut_past_a_try_that_failed_before_saying_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hearth.runtime.recovery.BACKOFF_BASE_S", 0.01)
    steps = [
        error("transient", "connection reset", after_chunks=["The capital ", "of France"]),
        error("transient", "overloaded"),  # the continuation's first try: no text at all
        reply(" is Paris."),
    ]
    app = app_with(simple_agent("a"), models=[ScriptedModel("a", lambda _: steps.pop(0))])
    async with app.run() as rt:
        answer = await rt.read(await rt.dispatch("a", "c", "capital?"), timeout=10)
    assert answer.text == "The capital of France is Paris."


async def test_a_terminal_provider_error_fails_with_its_message() -> None:
    app = app_with(
        simple_agent("a"), models=[ScriptedModel("a", [error("terminal", "401 bad key")])]
    )
    async with app.run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as info:
            await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)
    assert info.value.type == "provider_error" and "401 bad key" in str(info.value)


class BuggyProvider:
    """A provider of the application's own whose code raises: ``raises`` once per call (the
    first ``bad`` calls), after streaming a little text."""

    name = "buggy"

    def __init__(self, raises: BaseException, bad: int) -> None:
        self.raises, self.bad, self.calls = raises, bad, 0

    def supports(self, model: str) -> bool:
        return True

    def context_window(self, model: str) -> int:
        return 100_000

    async def stream(self, request: ModelRequest) -> Any:
        self.calls += 1
        if self.calls <= self.bad:
            yield TextDelta("par")
            if isinstance(self.raises, asyncio.CancelledError):
                await leak_a_cancellation()
            raise self.raises
        yield TextDelta("whole")
        yield Finished("stop", None)

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize(
    ("raises", "named"),
    [
        (KeyError("choices"), "KeyError: 'choices'"),
        (SystemExit(1), "SystemExit: 1"),
        (asyncio.CancelledError(), "CancelledError (nothing cancelled it)"),
    ],
)
async def test_what_a_providers_own_code_raises_is_a_transient_provider_error(
    monkeypatch: pytest.MonkeyPatch, raises: BaseException, named: str
) -> None:
    """It crashed the attempt (logged as a bug of the runtime's, or for SystemExit the process)
    and the next attempt asked the model again at once, ten times. Now it is recorded as a
    transient error of the turn, retried with backoff under the durable budget, and named in
    the submission's error when that runs out."""
    monkeypatch.setattr("hearth.runtime.recovery.BACKOFF_BASE_S", 0.01)

    @hearth.agent
    def asks(ctx: hearth.AgentContext) -> str:
        ctx.use_model("buggy/m")
        return ""

    flaky, broken = BuggyProvider(raises, bad=2), BuggyProvider(raises, bad=100)
    async with app_with(asks, models=[flaky]).run() as rt:  # type: ignore[list-item]
        # (each cut try's "par" is kept, and the reply goes on from it)
        answer = await rt.read(await rt.dispatch("asks", "c", "go"), timeout=10)
        assert answer.text == "parparwhole"
        errors = [
            r.error
            for r in await rt.history("asks", "c")
            if r.type == "assistant_message_completed"
        ][:2]
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]
    assert errors == [{"kind": "transient", "message": f"buggy: the provider raised {named}"}] * 2
    async with app_with(asks, models=[broken]).run() as rt:  # type: ignore[list-item]
        with pytest.raises(hearth.SubmissionFailed) as info:
            await rt.read(await rt.dispatch("asks", "c", "go"), timeout=10)
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]
    assert info.value.type == "provider_error" and named in str(info.value)
    assert broken.calls == 4  # the first call and three retries


class Yielding(BuggyProvider):
    """A provider of the application's own that yields ``events`` for every request."""

    def __init__(self, events: list[Any]) -> None:
        super().__init__(KeyError("unused"), bad=0)
        self.events = events

    async def stream(self, request: ModelRequest) -> Any:
        self.calls += 1
        for event in self.events:
            yield event


@pytest.mark.parametrize(
    ("events", "named"),
    [
        (["a bare string"], "yielded 'a bare string', which is not a model event"),
        ([TextDelta(42)], "yielded TextDelta(text=42), which is not a model event"),  # type: ignore[arg-type]
        (
            [ToolCallEvent(ToolCall("c1", "echo", {"n": {1, 2}}))],
            "gave tool call arguments that are not JSON",
        ),
        ([Finished(None, None)], "which is not a model event"),  # type: ignore[arg-type]
    ],
)
async def test_an_event_a_provider_may_not_yield_is_a_transient_provider_error(
    monkeypatch: pytest.MonkeyPatch, events: list[Any], named: str
) -> None:
    """Each of these crashed the attempt inside hearth's own code (an AttributeError reading
    the event, a TypeError writing it) and the model was asked again at once, ten times."""
    monkeypatch.setattr("hearth.runtime.recovery.BACKOFF_BASE_S", 0.01)

    @hearth.agent
    def asks(ctx: hearth.AgentContext) -> str:
        ctx.use_model("buggy/m")
        return ""

    provider = Yielding(events)
    async with app_with(asks, models=[provider]).run() as rt:  # type: ignore[list-item]
        with pytest.raises(hearth.SubmissionFailed) as info:
            await rt.read(await rt.dispatch("asks", "c", "go"), timeout=10)
        assert [s.attempt for s in await rt.store.list_submissions()] == [1]
    assert info.value.type == "provider_error" and named in str(info.value)
    assert provider.calls == 4


async def test_what_a_provider_yields_is_kept_as_json_gives_it_back() -> None:
    """Tool-call arguments in tuples, usage with counts that are not counts: the call is kept
    with its arguments as JSON reads them, the usage with its integer counts only."""

    @hearth.tool
    def echo(n: list[int]) -> str:
        """Echo numbers."""
        return f"got {n}"

    class Once(Yielding):
        async def stream(self, request: ModelRequest) -> Any:
            self.calls += 1
            if self.calls == 1:
                yield ToolCallEvent(ToolCall("c1", "echo", {"n": (1, 2)}))
                yield Finished("tool_use", {"input_tokens": 3, "cost": 0.5})  # type: ignore[dict-item]
            else:
                yield TextDelta("done")
                yield Finished("stop", None)

    @hearth.agent
    def asks(ctx: hearth.AgentContext) -> str:
        ctx.use_model("buggy/m")
        ctx.use_tool(echo)
        return ""

    async with app_with(asks, models=[Once([])]).run() as rt:  # type: ignore[list-item]
        assert (await rt.read(await rt.dispatch("asks", "c", "go"), timeout=10)).text == "done"
        records = await rt.history("asks", "c")
    [asked] = [r for r in records if r.type == "assistant_tool_call"]
    assert asked.arguments == {"n": [1, 2]}
    assert [o.content for o in of(records, ToolOutcome)] == ["got [1, 2]"]
    first = of(records, AssistantMessageCompleted)[0]
    assert first.usage == {"input_tokens": 3}


async def test_a_provider_raising_in_a_compactions_summary_call_is_retried_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The summary call of a compaction reads the provider the same way as a turn does."""
    from hearth.runtime.compaction import SUMMARY_PROMPT

    monkeypatch.setattr("hearth.runtime.recovery.BACKOFF_BASE_S", 0.01)

    class Overflowing(BuggyProvider):
        summaries = 0
        turns = 0

        async def stream(self, request: ModelRequest) -> Any:
            if request.system == SUMMARY_PROMPT:
                self.summaries += 1
                if self.summaries == 1:
                    raise KeyError("summary")
                yield TextDelta("a summary")
                yield Finished("stop", None)
                return
            self.turns += 1
            if self.turns == 2:  # the second message: the history is summarised first
                raise hearth.ProviderError("too long", kind="overflow")
            yield TextDelta("first" if self.turns == 1 else "after compaction")
            yield Finished("stop", None)

    @hearth.agent
    def asks(ctx: hearth.AgentContext) -> str:
        ctx.use_model("buggy/m")
        return ""

    provider = Overflowing(KeyError("unused"), bad=0)
    async with app_with(asks, models=[provider]).run() as rt:  # type: ignore[list-item]
        assert (await rt.read(await rt.dispatch("asks", "c", "one"), timeout=10)).text == "first"
        answer = await rt.read(await rt.dispatch("asks", "c", "two"), timeout=10)
        assert [s.attempt for s in await rt.store.list_submissions()] == [1, 1]
    assert answer.text == "after compaction"
    assert (provider.summaries, provider.turns) == (2, 3)


# --- shutdown --------------------------------------------------------------------------------


async def test_graceful_shutdown_releases_running_work_and_the_next_run_finishes_it(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'h.db'}"
    model = ScriptedModel(
        "a", [stream("part one, ", "part two", delays=[0, 30]), reply("the rest")]
    )
    app = app_with(simple_agent("a"), models=[model], db=db)
    async with app.run() as rt:
        receipt = await rt.dispatch("a", "c", "go")
        while not any(isinstance(r, AssistantTextDelta) for r in await rt.history("a", "c")):
            await asyncio.sleep(0.01)
    async with app.run() as rt:
        sub = await rt.submission(receipt.submission_id)
        assert sub.status == "running" and sub.outcome is None and sub.lease_expires_at == 0
        # (the saved part, then what the model went on with)
        assert (await rt.read(receipt, timeout=10)).text == "part one, the rest"
        history = await rt.history("a", "c")
    assert len(of(history, SubmissionSettled)) == 1
    assert [s.signal_type for s in of(history, Signal)] == ["stream_interrupted"]


async def test_rolling_restarts_do_not_use_up_the_attempts(tmp_path: Path) -> None:
    """Each graceful shutdown counted as a failed attempt: with ``max_attempts=1``, the first
    restart failed the submission ``retry_exhausted`` though nothing had failed."""
    db = f"sqlite:///{tmp_path / 'h.db'}"
    cut = stream("part one, ", "part two", delays=[0, 30])
    model = ScriptedModel("a", [cut, cut, cut, reply("the rest")])
    agent = simple_agent("a", durability=hearth.Durability(max_attempts=1))
    app = app_with(agent, models=[model], db=db)
    for restarts in range(3):
        async with app.run() as rt:
            if restarts == 0:
                receipt = await rt.dispatch("a", "c", "go")
            async with asyncio.timeout(10):  # (the submission failed: no more deltas)
                while len(of(await rt.history("a", "c"), AssistantTextDelta)) <= restarts:
                    await asyncio.sleep(0.01)
    async with app.run() as rt:
        # (what each stopped stream had saved, then the rest)
        assert (await rt.read(receipt, timeout=10)).text == "part one, " * 3 + "the rest"
        sub = await rt.submission(receipt.submission_id)
    assert (sub.attempt, sub.releases, sub.interruptions) == (4, 3, 1)


async def test_work_that_winds_down_past_the_shutdown_time_is_still_given_back_gracefully(
    tmp_path: Path,
) -> None:
    """A tool whose cleanup outlasts ``shutdown_s``: its lease was released as after a crash
    (counted against ``max_attempts=1``: the next run failed it ``retry_exhausted``)."""
    stopped = asyncio.Event()

    @hearth.tool
    async def job() -> str:
        """Work that cleans up when it is stopped."""
        try:
            await asyncio.sleep(0 if stopped.is_set() else 60)
        except asyncio.CancelledError:
            stopped.set()
            await asyncio.sleep(1.0)  # flushing, closing: longer than shutdown_s
            raise
        return "done"

    @hearth.agent(durability=hearth.Durability(max_attempts=1))
    def worker(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/w")
        ctx.use_tool(job)
        return "Work."

    def script(request: ModelRequest) -> Step:
        done = isinstance(request.messages[-1], ToolResult)
        return reply("finished") if done else calls(call("job"))

    db = f"sqlite:///{tmp_path / 'h.db'}"
    app = hearth.App([worker], db=db, providers=[ScriptedModel("w", script)], shutdown_s=0.2)
    async with app.run() as rt:
        receipt = await rt.dispatch("worker", "c", "go")
        while not of(await rt.history("worker", "c"), AssistantToolCall):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
    async with app.run() as rt:
        sub = await rt.submission(receipt.submission_id)
        assert (sub.releases, sub.interruptions) == (1, 0)
        assert (await rt.read(receipt, timeout=10)).text == "finished"


@pytest.mark.parametrize("how", ["cancel_scope", "cancelled_twice"])
async def test_a_cancellation_again_while_app_run_stops_still_gives_the_work_back(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled again while it stopped (an anyio cancel scope cancels at every await; a task
    may be cancelled twice), ``app.run()`` closed the store under the attempt ("unexpected
    exception ... the SQLite store is not open"): its lease stayed held, the attempt counted."""
    started = asyncio.Event()

    @hearth.tool
    async def charge() -> str:
        """Charge; on cancellation, undo the hold (it takes a moment)."""
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)
            raise
        return "charged"

    model = ScriptedModel("a", [calls(call("charge")), reply("done")])
    db = tmp_path / "h.db"
    app = hearth.App(
        [simple_agent("a", charge)], db=f"sqlite:///{db}", providers=[model], shutdown_s=10
    )
    receipts: list[Receipt] = []
    scopes: list[anyio.CancelScope] = []

    async def service() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            async with app.run() as rt:
                receipts.append(await rt.dispatch("a", "c", "go"))
                await rt.read(receipts[0])

    serving = asyncio.create_task(service())
    await asyncio.wait_for(started.wait(), 10)
    if how == "cancel_scope":
        scopes[0].cancel()
    else:
        serving.cancel()
        await asyncio.sleep(0.1)  # the stop is under way
        serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(serving, 30)
    assert "unexpected exception" not in caplog.text
    store = open_store(str(db))
    await store.open()
    try:
        sub = await store.get_submission(receipts[0].submission_id)
    finally:
        await store.close()
    assert sub is not None and sub.outcome is None
    assert (sub.lease_expires_at, sub.releases) == (0, 1)  # given back, not counted


async def test_an_abort_just_after_the_settlement_is_not_reported_as_a_takeover(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The abort interrupted work whose own settlement had just committed; the concluding run
    found the row settled and one process logged that another owner had taken its work."""
    from hearth.store.events import ABORT, Event

    app = app_with(simple_agent("a"), models=[ScriptedModel("a", [reply("done")])])
    async with app.run() as rt:
        settle = rt.store.settle

        async def settle_then_abort(*args: Any, **kwargs: Any) -> int:
            offset = await settle(*args, **kwargs)
            rt.coordinator._on_event(Event(ABORT, "a/c"))  # the abort's notice, arriving now
            return offset

        rt.store.settle = settle_then_abort  # type: ignore[method-assign]
        with caplog.at_level("DEBUG", logger="hearth.coordinator"):
            assert (await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)).text == "done"
            await rt.settle_all(timeout=10)
            for _ in range(100):
                if "already settled" in caplog.text:
                    break
                await asyncio.sleep(0.01)
    assert "taken over" not in caplog.text
    assert "already settled by attempt 1" in caplog.text


async def test_a_sync_tool_raising_stop_iteration_gets_an_error_outcome() -> None:
    """A next() that found nothing, in a sync tool: no future can carry the StopIteration out
    of the worker thread, and the call never ended (the submission ran to its deadline)."""

    @hearth.tool
    def find(name: str) -> str:
        """Find a name."""
        return next(n for n in ["ada", "bob"] if n == name)

    def script(request: ModelRequest) -> Step:
        last = request.messages[-1]
        return (
            reply(str(last.content))
            if isinstance(last, ToolResult)
            else calls(call("find", name="eve"))
        )

    async with app_with(simple_agent("a", find), models=[ScriptedModel("a", script)]).run() as rt:
        answer = await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)
        (outcome,) = of(await rt.history("a", "c"), ToolOutcome)
    assert outcome.is_error and "StopIteration" in str(outcome.content)
    assert "StopIteration" in answer.text


async def test_a_sync_tool_runs_off_the_event_loop() -> None:
    import threading

    seen: list[str] = []

    @hearth.tool
    def blocking() -> str:
        """Block for a moment, as sync code does."""
        seen.append(threading.current_thread().name)
        return "ok"

    model = ScriptedModel("a", [calls(call("blocking")), reply("done")])
    app = app_with(simple_agent("a", blocking), models=[model])
    async with app.run() as rt:
        assert (await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)).text == "done"
    assert seen and seen[0] != threading.main_thread().name


async def test_sync_tools_stuck_for_good_hold_up_neither_other_calls_nor_the_stop(
    tmp_path: Path,
) -> None:
    """Sync tools ran on asyncio's default executor (min(32, cpus + 4) threads): calls stuck in
    a read with no timeout, aborted, kept their threads, and once they were as many as its
    threads a sync tool that only returns never ran, and the store's stop (which waited on that
    executor too) ran the shutdown long past ``shutdown_s``."""
    import os
    import threading

    release = threading.Event()
    stuck_for = min(32, (os.cpu_count() or 1) + 4) + 2
    entered: list[str] = []

    @hearth.tool
    def read_socket() -> str:
        """A read with no timeout."""
        entered.append(threading.current_thread().name)
        release.wait(60)
        return "late"

    @hearth.tool
    def quick() -> str:
        """Only returns."""
        return "quick"

    def script(request: ModelRequest) -> Step:
        if isinstance(request.messages[-1], ToolResult):
            return reply(str(request.messages[-1].content))
        text = str(request.messages[-1].content)
        return calls(call(text))

    agent = simple_agent("a", read_socket, quick)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    app = hearth.App([agent], db=db, providers=[ScriptedModel("a", script)], shutdown_s=5)
    try:
        async with app.run() as rt:
            for i in range(stuck_for):
                await rt.dispatch("a", f"s-{i}", "read_socket")
            for _ in range(1000):  # (before: as many as the executor's threads, no more)
                if len(entered) == stuck_for:
                    break
                await asyncio.sleep(0.01)
            for i in range(stuck_for):
                await rt.abort("a", f"s-{i}")
            answer = await rt.read(await rt.dispatch("a", "q", "quick"), timeout=30)
            assert answer.text == "quick"
        assert not release.is_set()  # the stop did not wait for the stuck calls
    finally:
        release.set()


async def test_a_tool_that_waits_for_its_own_conversation_is_told_at_once() -> None:
    """A tool that sent a message to its own conversation and read it waited until the
    submission's deadline (an hour by default): the message joins only after the tool returns.
    A read of another conversation, and one after the attempt, still wait as always."""
    seen: dict[str, Any] = {}

    @hearth.tool
    async def ask(ctx: hearth.ToolContext) -> str:
        """Send a message and read its answer."""
        rt = seen["rt"]
        agent, _, id = ctx.conversation_id.partition("/")
        own = await rt.dispatch(agent, id, "inner")
        seen["own"] = own
        try:
            await rt.read(own, timeout=30)
        except hearth.ReadOfOwnConversation as exc:
            seen["error"] = str(exc)
        other = await rt.dispatch(agent, "other", "plain")
        return (await rt.read(other, timeout=30)).text

    def script(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if isinstance(last, ToolResult):
            return reply(f"got {last.content}")
        return calls(call("ask")) if last.content == "go" else reply(str(last.content))

    async with app_with(simple_agent("a", ask), models=[ScriptedModel("a", script)]).run() as rt:
        seen["rt"] = rt
        await rt.read(await rt.dispatch("a", "c", "go"), timeout=30)
        assert (await rt.read(seen["own"], timeout=30)).text == "inner"  # from outside: fine
        (outcome,) = of(await rt.history("a", "c"), ToolOutcome)
    assert "whose attempt this code runs inside" in seen["error"]
    assert outcome.content == "plain"


# --- a bug of hearth's own ---------------------------------------------------------------------


async def test_an_attempt_that_a_bug_ends_is_retried_after_a_pause_not_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A bug the next attempt meets again was retried at once: through the whole budget in
    milliseconds, and for ever (thousands of attempts a second) when it lay on the way to
    settling an abort."""
    from hearth.runtime import coordinator, model_turn
    from hearth.store.sqlite import SQLiteStore

    def planted(*args: Any) -> Any:
        raise RuntimeError("a planted bug")

    monkeypatch.setattr(model_turn, "build_request", planted)
    monkeypatch.setattr(coordinator, "BUG_PAUSE_S", 30.0)
    agent = simple_agent("b", durability=hearth.Durability(max_attempts=3))
    db = f"sqlite:///{tmp_path / 'h.db'}"
    models = [ScriptedModel("b", [reply("never")])]
    async with app_with(agent, models=models, db=db).run() as rt:
        receipt = await rt.dispatch("b", "c", "go")
        for _ in range(500):
            if coordinator.UNEXPECTED in caplog.text:
                break
            await asyncio.sleep(0.01)
        assert "releasing it for a retry in 30 s" in caplog.text
        await asyncio.sleep(0.3)
        sub = await rt.submission(receipt.submission_id)
        assert (sub.status, sub.attempt) == ("running", 1)
    # Shut down during the pause: it ended, and the claim was given back (not left to expire).
    store = SQLiteStore(str(tmp_path / "h.db"))
    await store.open()
    try:
        after = await store.get_submission(receipt.submission_id)
    finally:
        await store.close()
    assert after is not None and (after.attempt, after.lease_expires_at) == (1, 0)


async def test_a_step_inside_a_step_transaction_function_is_refused_at_once() -> None:
    """It waited for the submission's row that the transaction holds locked, on another
    connection: a deadlock no database sees, until the idle-in-transaction timeout (10 s)."""
    from hearth.steps import Steps

    async def record(name: str, value: Any, sets: Any) -> None:
        pass

    async def transact(name: str, fn: Any) -> Any:
        return await fn(None)  # the store would run fn inside its transaction

    steps = Steps("call_1", {}, record, transact=transact)

    async def nested(conn: Any) -> int:
        return int(await steps.do("inner", lambda: 41)) + 1

    with pytest.raises(hearth.StepError, match="cannot be nested"):
        await steps.transaction("outer", nested)
    assert await steps.do("inner", lambda: 41) == 41  # outside it, the name is still free


async def test_misdeclared_apps_agents_and_receipts_say_what_is_wrong() -> None:
    """Each was a raw TypeError, KeyError or IndexError, or taken silently: an async agent
    failed every submission later, and a receipt with ``"deduplicated": "false"`` read true."""

    async def sleepy(ctx: hearth.AgentContext) -> str:
        return ""

    with pytest.raises(hearth.ConfigurationError, match="not async"):
        hearth.agent(sleepy)
    agent = simple_agent("a")
    for agents in (agent, None):
        with pytest.raises(hearth.ConfigurationError, match=r"list of @hearth\.agent"):
            hearth.App(agents, db="memory")  # type: ignore[arg-type]
    good = {"submission_id": "s_1", "conversation_id": "a/c", "offset": 0, "accepted_at": 1.0}
    assert Receipt.from_json(good).agent == "a"
    for bad, says in (
        ({}, "'submission_id' must be a string"),
        ({**good, "deduplicated": "false"}, "'deduplicated' must be true or false"),
        ({**good, "submission_id": None}, "'submission_id' must be a string"),
        ({**good, "conversation_id": "x"}, "agent/id"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            Receipt.from_json(bad)
    async with app_with(agent, models=[ScriptedModel("a", [reply("x")])]).run() as rt:
        await rt.read(await rt.dispatch("a", "c", "go"), timeout=10)
        for after in (None, float("nan"), 10**30, True):
            with pytest.raises(hearth.InvalidInput, match="after"):
                await rt.history("a", "c", after=after)  # type: ignore[arg-type]


async def test_a_lease_whose_release_failed_is_given_back_while_other_work_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After a disk-full error, the release failed too: the row stayed running under this
    process, and each heartbeat (which renews all of an owner's leases) kept it so for as long
    as any other work ran here. The submission never finished."""
    from hearth.runtime import coordinator, model_turn

    build = model_turn.build_request
    failed: list[str] = []

    def once(scope: Any, rendered: Any, model: str) -> Any:
        if scope.conversation_id == "echo/c" and not failed:
            failed.append("turn")
            raise hearth.StoreError("the disk is full (planted)")
        return build(scope, rendered, model)

    release = coordinator.Coordinator._release

    async def release_once(self: Any, sub: Any) -> None:
        if sub.conversation_id == "echo/c" and len(failed) == 1:
            failed.append("release")
            raise hearth.StoreError("the disk is still full (planted)")
        await release(self, sub)

    monkeypatch.setattr(model_turn, "build_request", once)
    monkeypatch.setattr(coordinator.Coordinator, "_release", release_once)
    monkeypatch.setattr(coordinator, "BUG_PAUSE_S", 0.0)
    busy = simple_agent("busy")
    echo = simple_agent("echo")
    models = [ScriptedModel("busy", [stall()]), ScriptedModel("echo", [reply("heard")])]
    app = hearth.App(
        [busy, echo], db="memory", providers=models, lease_s=2, heartbeat_s=0.1, scan_s=0.2
    )
    async with app.run() as rt:
        await rt.dispatch("busy", "b", "hold a lease")  # other work: the heartbeat runs
        answer = await rt.read(await rt.dispatch("echo", "c", "hi"), timeout=15)
    assert answer.text == "heard" and failed == ["turn", "release"]
    assert "gave back the lease" in caplog.text


@pytest.mark.parametrize("timeout", [float("nan"), -1, "5", True])
async def test_read_refuses_a_timeout_that_is_no_number_of_seconds(timeout: object) -> None:
    """A NaN waited for good; a string raised a bare TypeError from inside the wait."""
    model = ScriptedModel("t", [reply("ok")])

    @hearth.agent
    def t(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/t")
        return ""

    async with hearth.App([t], db="memory", providers=[model]).run() as rt:
        receipt = await rt.dispatch("t", "c", "hi")
        with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
            await rt.read(receipt, timeout=timeout)  # type: ignore[arg-type]
        assert (await rt.read(receipt, timeout=10)).text == "ok"


async def test_a_sync_step_function_that_holds_the_loop_is_reported(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync step function runs on the event loop (a thread hop per step cost a trivial step
    0.2-0.3 ms). Blocking work in it holds every other conversation and the heartbeats: past
    the lease a peer runs the step again. It is said in the log, with the way out; and that way
    out, ``lambda: asyncio.to_thread(work)``, runs off the loop: the work here waits for the
    loop to answer it, which on the loop could never be."""
    monkeypatch.setattr(hearth._tasks, "HELD_THE_LOOP_S", 0.05)
    answered = threading.Event()

    def blocking() -> bool:
        asyncio.run_coroutine_threadsafe(answer(), loop)
        return answered.wait(timeout=10)

    async def answer() -> None:
        answered.set()

    @hearth.tool(durable=True)
    async def charge(ctx: hearth.ToolContext) -> bool:
        """Charge, with a blocking client."""
        await ctx.step.do("slow", lambda: time.sleep(0.1))
        return bool(await ctx.step.do("charge", lambda: asyncio.to_thread(blocking)))

    def dawdle(event: object) -> None:
        time.sleep(0.1)  # a sync hook holds the loop as much

    @hearth.agent
    def payer(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/payer")
        ctx.use_tool(charge)
        ctx.on_agent_start(dawdle)
        return ""

    loop = asyncio.get_running_loop()
    model = ScriptedModel("payer", [calls(call("charge", id="c")), reply("done")])
    async with hearth.App([payer], db="memory", providers=[model]).run() as rt:
        await rt.read(await rt.dispatch("payer", "p", "go"), timeout=30)
        [outcome] = [r for r in await rt.history("payer", "p") if isinstance(r, ToolOutcome)]
    assert outcome.content is True
    assert "step 'slow' ran 0.1 s on the event loop" in caplog.text
    assert "the on_agent_start callback dawdle ran 0.1 s on the event loop" in caplog.text
    assert "asyncio.to_thread(work)" in caplog.text
    assert "step 'charge'" not in caplog.text


async def test_a_signal_with_a_field_it_does_not_have_is_refused_as_over_http() -> None:
    """``rt.dispatch`` dropped it (a misspelt ``atributes``: the attributes stored empty), where
    ``POST`` answered 400 ``unknown signal field(s)``."""
    model = ScriptedModel("s", [reply("ok")])

    @hearth.agent
    def s(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/s")
        return ""

    async with hearth.App([s], db="memory", providers=[model]).run() as rt:
        with pytest.raises(hearth.InvalidInput, match=r"unknown signal field.*atributes"):
            await rt.dispatch("s", "c", signal={"type": "t", "atributes": {"k": 1}})
        assert await rt.submissions() == []


async def test_an_abort_as_a_tool_batch_begins_leaves_no_warning() -> None:
    """The batch made its calls' coroutines before their tasks ran: an abort landing in
    between left "coroutine 'ToolBatch._run_call' was never awaited" on the user's stderr."""
    import gc
    import warnings

    @hearth.tool
    async def slow(x: int) -> dict[str, int]:
        """Slow."""
        await asyncio.sleep(0.02)
        return {"x": x}

    def script(request: ModelRequest) -> Step:
        return reply("done") if results(request) else calls(call("slow", x=1), call("slow", x=2))

    app = app_with(simple_agent("w", slow, name="worker"), models=[ScriptedModel("w", script)])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        async with app.run() as rt:
            for i in range(150):  # (about one try in 35 landed in between)
                receipt = await rt.dispatch("worker", f"c{i}", "go")
                await asyncio.sleep(0.00005 * (i % 100))
                await rt.abort("worker", f"c{i}")
                with contextlib.suppress(hearth.SubmissionAborted):
                    await rt.read(receipt, timeout=20)
                gc.collect()
                assert not [str(w.message) for w in seen if "never awaited" in str(w.message)]
