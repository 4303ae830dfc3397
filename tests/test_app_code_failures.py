"""Application code that calls ``sys.exit`` (argparse does, on arguments it cannot parse), or
lets out a ``CancelledError`` nothing asked for (a library's, leaked), fails its own unit of
work; the runtime, and every other conversation in it, goes on.

Before, the ``SystemExit`` went up through the event loop and ended the process: a tool, a step's
function, a render function, a hook or a channel's callback could stop the server, and a durable
tool would stop it again on every recovery. A leaked cancellation was taken for hearth stopping
the work: it ended the attempt (a durable tool's, on every attempt), or, in a channel's
callback, went up through ``deliver`` and left the delivery neither admitted nor kept as
failed."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import pydantic
import pytest
from leaky_library import leak_a_cancellation

import hearth
from hearth.errors import app_failure
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.records import ToolOutcome
from hearth.runtime.hooks import AgentStart
from hearth.testing import ScriptedModel, Step, call, calls, reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def parse_count(text: str) -> int:
    """What a tool wrapping a command-line parser does: argparse exits on bad input."""
    parser = argparse.ArgumentParser(prog="count", exit_on_error=True)
    parser.add_argument("--n", type=int)
    return int(parser.parse_args(["--n", text]).n)


@hearth.tool
async def async_exit(text: str) -> int:
    """Parse a count (async)."""
    return parse_count(text)


@hearth.tool
def sync_exit(text: str) -> int:
    """Parse a count (on a worker thread)."""
    return parse_count(text)


@hearth.tool(durable=True)
async def step_exit(text: str, ctx: hearth.ToolContext) -> int:
    """Parse a count inside a step."""
    return int(await ctx.step.do("parse", lambda: parse_count(text)))


@hearth.tool
def direct_exit() -> str:
    """Exit with a message."""
    sys.exit("bye")


@pytest.mark.parametrize("tool", [async_exit, sync_exit, step_exit, direct_exit])
async def test_a_tool_that_exits_fails_its_call_and_the_turn_goes_on(
    tool: hearth.Tool, capsys: pytest.CaptureFixture[str]
) -> None:
    @hearth.agent
    def agent(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")
        ctx.use_tool(tool)
        return ""

    arguments: dict[str, Any] = {} if tool is direct_exit else {"text": "x"}

    def script(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if isinstance(last, ToolResult):
            return reply("handled")
        if isinstance(last, UserTurn) and last.content == "hi":
            return reply("still here")
        return calls(call(tool.name, arguments))

    model = ScriptedModel("m", script)
    app = hearth.App([agent], db="memory", providers=[model])
    async with app.run() as rt:
        answer = await rt.read(await rt.dispatch("agent", "c", "go"), timeout=10)
        assert (answer.outcome, answer.text) == ("completed", "handled")
        [outcome] = [r for r in await rt.history("agent", "c") if isinstance(r, ToolOutcome)]
        # The runtime is still running: another conversation is served after it.
        assert (await rt.read(await rt.dispatch("agent", "d", "hi"), timeout=10)).text == (
            "still here"
        )
    assert outcome.is_error
    assert outcome.content["type"] == "exception"
    expected = "SystemExit: bye" if tool is direct_exit else "SystemExit: 2"
    assert outcome.content["message"] == expected
    capsys.readouterr()  # argparse's usage message


async def test_a_render_function_or_hook_that_exits_fails_its_submission() -> None:
    @hearth.agent
    def renders(ctx: hearth.AgentContext) -> str:
        sys.exit(3)

    @hearth.agent
    def hooks(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")

        @ctx.on_agent_start
        def leave(event: AgentStart) -> None:
            sys.exit(4)

        return ""

    model = ScriptedModel("m", [reply("fine")])
    app = hearth.App([renders, hooks], db="memory", providers=[model])
    async with app.run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as rendered:
            await rt.read(await rt.dispatch("renders", "c", "go"), timeout=10)
        with pytest.raises(hearth.SubmissionFailed) as hooked:
            await rt.read(await rt.dispatch("hooks", "c", "go"), timeout=10)
        assert [s.attempt for s in await rt.submissions()] == [1, 1]  # failed, not retried
    assert rendered.value.type == "agent_error" and "SystemExit: 3" in str(rendered.value)
    assert hooked.value.type == "hook_error" and "SystemExit: 4" in str(hooked.value)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


class ForeignBase(BaseException):
    """What ``pytest.fail`` raises in a test double: a BaseException, not an Exception."""


@pytest.mark.parametrize("raised", [Unprintable, ForeignBase, GeneratorExit])
async def test_what_cannot_be_printed_or_is_a_foreign_base_exception_fails_its_work_once(
    raised: type[BaseException],
) -> None:
    """Rendering raised past every boundary (formatting the message raised again, or the class
    was no Exception): the submission was retried for ever, an abort included, never settled.
    In a tool the call was marked interrupted; in a hook the submission ran out of attempts.
    A ``GeneratorExit`` the code raised itself (not a close of it) ended the attempt's
    supervisor: the submission stayed running until its lease expired."""

    def fail() -> None:
        raise raised("a double")

    @hearth.agent
    def renders(ctx: hearth.AgentContext) -> str:
        fail()
        return ""

    @hearth.agent
    def hooks(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")
        ctx.on_agent_start(lambda event: fail())
        return ""

    @hearth.tool
    def failing() -> str:
        """Fail (on a worker thread)."""
        fail()
        return ""

    @hearth.tool
    async def failing_async() -> str:
        """Fail."""
        fail()
        return ""

    @hearth.agent
    def tools(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/t")
        ctx.use_tool(failing)
        ctx.use_tool(failing_async)
        return ""

    models = [
        ScriptedModel("m", [reply("fine")]),
        ScriptedModel("t", [calls(call("failing"), call("failing_async")), reply("handled")]),
    ]
    said = f"{raised.__name__}: " + ("<its message" if raised is Unprintable else "a double")
    async with hearth.App([renders, hooks, tools], db="memory", providers=models).run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as rendered:
            await rt.read(await rt.dispatch("renders", "c", "go"), timeout=10)
        with pytest.raises(hearth.SubmissionFailed) as hooked:
            await rt.read(await rt.dispatch("hooks", "c", "go"), timeout=10)
        assert (await rt.read(await rt.dispatch("tools", "c", "go"), timeout=10)).text == "handled"
        told = {r.name: r for r in await rt.history("tools", "c") if isinstance(r, ToolOutcome)}
        assert [s.attempt for s in await rt.submissions()] == [1, 1, 1]
    assert rendered.value.type == "agent_error" and said in str(rendered.value)
    assert hooked.value.type == "hook_error" and said in str(hooked.value)
    threaded, direct = told["failing"], told["failing_async"]
    assert direct.content["type"] == "exception" and direct.content["message"].startswith(said)
    if raised is GeneratorExit:  # (out of a worker thread, a future would carry it as a close)
        said = "RuntimeError: GeneratorExit raised: GeneratorExit('a double')"
    assert threaded.content["type"] == "exception"
    assert threaded.content["message"].startswith(said)


async def test_a_close_of_suspended_code_is_not_taken_for_its_failure() -> None:
    """A ``GeneratorExit`` thrown in by a close of the suspended coroutine goes on up (a
    coroutine that swallows it is an error); one raised in the caller's own task is the code's."""
    seen: list[bool] = []
    parked: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def boundary() -> None:
        caller = asyncio.current_task()
        try:
            await parked
        except BaseException as exc:
            seen.append(app_failure(exc, caller))
            raise

    task = asyncio.create_task(boundary())
    await asyncio.sleep(0)  # parked on the future
    task.get_coro().close()  # type: ignore[union-attr]  # (what the garbage collector does)
    assert seen == [False]
    parked.set_result(None)
    with pytest.raises(RuntimeError):
        await task  # (its coroutine was closed under it)
    assert app_failure(GeneratorExit(), asyncio.current_task())
    assert not app_failure(GeneratorExit())


@hearth.agent
def inbox(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/m")
    return ""


def verify(headers: object, body: bytes) -> hearth.Delivery:
    return hearth.Delivery(id="d-1", type="t", data={})


async def test_a_channel_whose_verify_or_receive_exits_refuses_that_delivery() -> None:
    def verify_exits(headers: object, body: bytes) -> hearth.Delivery:
        sys.exit(5)

    def receive_exits(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
        sys.exit(6)

    app = hearth.App(
        [inbox],
        channels=[
            hearth.Channel("verifier", verify=verify_exits, receive=receive_exits),
            hearth.Channel("router", verify=verify, receive=receive_exits),
        ],
        db="memory",
        providers=[ScriptedModel("m", [reply("fine")])],
    )
    async with app.run() as rt:
        with pytest.raises(hearth.ChannelFailed, match="verify raised SystemExit"):
            await rt.deliver("verifier", {}, b"{}")
        with pytest.raises(hearth.ChannelFailed, match="receive raised SystemExit"):
            await rt.deliver("router", {}, b"{}")
        [kept] = await rt.deliveries("router")
        assert kept.status == "failed"
        answer = await rt.read(await rt.dispatch("inbox", "c", "go"), timeout=10)
        assert answer.text == "fine"


async def test_a_hook_that_leaks_a_cancellation_fails_its_submission_once() -> None:
    @hearth.agent
    def hooks(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")

        @ctx.on_agent_start
        async def notify(event: AgentStart) -> None:
            await leak_a_cancellation()

        return ""

    async with hearth.App(
        [hooks], db="memory", providers=[ScriptedModel("m", [reply("never")])]
    ).run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(await rt.dispatch("hooks", "c", "go"), timeout=10)
        assert [s.attempt for s in await rt.submissions()] == [1]
    assert failed.value.type == "hook_error" and "CancelledError" in str(failed.value)


async def test_a_channel_whose_receive_leaks_a_cancellation_keeps_the_delivery_failed() -> None:
    async def receive(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
        await leak_a_cancellation()
        return []

    app = hearth.App(
        [inbox],
        channels=[hearth.Channel("router", verify=verify, receive=receive)],
        db="memory",
        providers=[ScriptedModel("m", [reply("fine")])],
    )
    async with app.run() as rt:
        with pytest.raises(hearth.ChannelFailed, match="receive raised CancelledError"):
            await rt.deliver("router", {}, b"{}")
        [kept] = await rt.deliveries("router")
        assert kept.status == "failed"


def exits(call: hearth.ReconcileCall) -> hearth.Done:
    sys.exit(7)  # a sync reconcile: it runs on a worker thread


async def leaks(call: hearth.ReconcileCall) -> hearth.Done:
    await leak_a_cancellation()
    return hearth.Done("paid")


class Receipt(pydantic.BaseModel):
    amount: float


def answers_nan(call: hearth.ReconcileCall) -> hearth.Done:
    return hearth.Done(Receipt(amount=float("nan")))  # was stored: every read answered 500


def answers_too_deep(call: hearth.ReconcileCall) -> hearth.Done:
    value: list[Any] = []
    for _ in range(3000):  # encoding it raised RecursionError: the abort never settled
        value = [value]
    return hearth.Done(value)


@pytest.mark.parametrize("reconcile", [exits, leaks, answers_nan, answers_too_deep])
async def test_a_reconcile_that_exits_leaks_or_answers_no_json_leaves_the_outcome_unknown(
    reconcile: Any,
) -> None:
    started = asyncio.Event()

    @hearth.tool(reconcile=reconcile)
    async def pay() -> str:
        """Pay, taking its time."""
        started.set()
        await asyncio.Event().wait()
        return "paid"

    @hearth.agent
    def till(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")
        ctx.use_tool(pay)
        return ""

    model = ScriptedModel("m", [calls(call("pay")), reply("fine")])
    async with hearth.App([till], db="memory", providers=[model]).run() as rt:
        receipt = await rt.dispatch("till", "c", "go")
        await started.wait()
        await rt.abort("till", "c")
        with pytest.raises(hearth.SubmissionAborted):
            await rt.read(receipt, timeout=10)
        [outcome] = [r for r in await rt.history("till", "c") if isinstance(r, ToolOutcome)]
        # The runtime goes on: the conversation takes its next message.
        assert (await rt.read(await rt.dispatch("till", "c", "again"), timeout=10)).text == "fine"
    assert outcome.reconciled is None and outcome.content["type"] == "interrupted"
