"""Durable waits in one process (SPEC §15): a durable tool pauses its submission until a value
arrives from outside, a timeout passes or an abort comes; waiting holds no task and no budget."""

from __future__ import annotations

import asyncio
import gc
import resource
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import waitapp
from earlyapp import EarlyWaits

import hearth
from hearth.records import Record, ToolOutcome, WaitResolved, WaitStarted
from hearth.runtime.runtime import Runtime
from hearth.runtime.waits import recorded_waits, wait_started
from hearth.steps import Steps, WaitPending
from hearth.testing import ScriptedModel, call, calls, reply
from hearth.testing.invariants import assert_invariants

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tools.log"
    monkeypatch.setenv("HEARTH_TEST_LOG", str(path))
    return path


def ran(log: Path, what: str) -> int:
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.split("|")[0] == what)


def app(db: str = "memory", **settings: Any) -> hearth.App:
    return hearth.App(waitapp.AGENTS, db=db, providers=waitapp.MODELS, **settings)


async def until_waiting(rt: Runtime, submission_id: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while (await rt.submission(submission_id)).status != "waiting":
        assert time.monotonic() < end, "the submission never started waiting"
        await asyncio.sleep(0.01)


def of(records: list[Record], kind: type[Record]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


async def test_a_wait_pauses_the_submission_and_its_value_completes_it(log: Path) -> None:
    async with app().run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "refund 250")
        await until_waiting(rt, receipt.submission_id)
        sub = await rt.submission(receipt.submission_id)
        assert (sub.lease_owner, sub.lease_expires_at, sub.attempt, sub.waits) == (None, None, 1, 1)
        assert rt.coordinator.running == 0  # no claim, no worker slot
        [wait] = await rt.waits()
        assert (wait.conversation_id, wait.name, wait.prompt) == (
            "cashier/c-1",
            "approval",
            "Refund 250 (order for 250)?",
        )
        assert wait.submission_id == receipt.submission_id and wait.expires_at is None

        await rt.resolve("cashier", "c-1", wait.wait_id, {"by": "ana"})
        answer = await rt.read(receipt, timeout=10)
        assert answer.text == "done: {'refunded': 250, 'approval': {'by': 'ana'}}"
        records = await rt.history("cashier", "c-1")
        [started] = of(records, WaitStarted)
        [resolved] = of(records, WaitResolved)
        assert started.wait_id == resolved.wait_id == wait.wait_id
        assert resolved.value == {"by": "ana"} and not resolved.timed_out
        assert (await rt.submission(receipt.submission_id)).attempt == 2
        assert await rt.waits() == []
        await assert_invariants(rt.store)
    assert (ran(log, "step-load"), ran(log, "step-pay")) == (1, 1)


async def test_a_repeat_with_the_same_value_is_accepted_and_another_value_conflicts() -> None:
    async with app().run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "refund 250")
        await until_waiting(rt, receipt.submission_id)
        [wait] = await rt.waits()
        await rt.resolve("cashier", "c-1", wait.wait_id, True)
        await rt.resolve("cashier", "c-1", wait.wait_id, True)  # a retried request: fine
        with pytest.raises(hearth.WaitConflict, match="another value"):
            await rt.resolve("cashier", "c-1", wait.wait_id, False)
        await rt.read(receipt, timeout=10)
        # Also after the submission settled.
        again = await rt.resolve("cashier", "c-1", wait.wait_id, True)
        assert again.state == "resolved"
        with pytest.raises(hearth.WaitConflict):
            await rt.resolve("cashier", "c-1", wait.wait_id, "yes")
        with pytest.raises(hearth.WaitNotFound):
            await rt.resolve("cashier", "c-1", "w_nope", True)
        with pytest.raises(hearth.WaitNotFound):  # a wait belongs to its conversation
            await rt.resolve("cashier", "c-2", wait.wait_id, True)
        records = await rt.history("cashier", "c-1")
        assert len(of(records, WaitResolved)) == 1


async def test_a_wait_past_its_timeout_raises_wait_timed_out_inside_the_tool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waitapp, "WAIT_S", 0.3)
    # The scan is far off: the coordinator's own timer must end the wait, with no request.
    async with app(scan_s=60.0).run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "refund 250")
        await until_waiting(rt, receipt.submission_id)
        [wait] = await rt.waits()
        assert wait.expires_at is not None
        answer = await rt.read(receipt, timeout=10)
        assert answer.text == "done: {'refunded': 0, 'why': 'nobody approved in time'}"
        [resolved] = of(await rt.history("cashier", "c-1"), WaitResolved)
        assert resolved.timed_out and resolved.value is None
        with pytest.raises(hearth.WaitConflict, match="timed out"):
            await rt.resolve("cashier", "c-1", wait.wait_id, True)
        await assert_invariants(rt.store)


async def test_an_abort_settles_a_waiting_submission_aborted() -> None:
    async with app().run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "refund 250")
        await until_waiting(rt, receipt.submission_id)
        [wait] = await rt.waits()
        result = await rt.abort("cashier", "c-1")
        assert result.submission_ids == [receipt.submission_id]
        with pytest.raises(hearth.SubmissionAborted) as caught:
            await rt.read(receipt, timeout=10)
        assert caught.value.interrupted_tools[0]["name"] == "refund"
        records = await rt.history("cashier", "c-1")
        [resolved] = of(records, WaitResolved)
        assert resolved.aborted
        with pytest.raises(hearth.WaitConflict, match="aborted"):
            await rt.resolve("cashier", "c-1", wait.wait_id, True)
        assert await rt.waits() == []
        await assert_invariants(rt.store)


async def test_messages_that_arrive_while_it_waits_queue_behind_it() -> None:
    async with app().run() as rt:
        first = await rt.dispatch("cashier", "c-1", "refund 250")
        await until_waiting(rt, first.submission_id)
        second = await rt.dispatch("cashier", "c-1", "hello")
        await asyncio.sleep(0.2)
        assert (await rt.submission(second.submission_id)).status == "queued"
        [wait] = await rt.waits()
        await rt.resolve("cashier", "c-1", wait.wait_id, True)
        # As for a running submission: once the refund's batch commits, the message joins.
        answer = await rt.read(first, timeout=10)
        assert (await rt.read(second, timeout=10)).text == answer.text
        records = await rt.history("cashier", "c-1")
        order = [r.type for r in records if r.type in ("wait_resolved", "user_message")]
        assert order == ["user_message", "wait_resolved", "user_message"]
        await assert_invariants(rt.store)


async def test_the_other_calls_of_the_batch_record_their_outcomes_before_the_pause(
    log: Path,
) -> None:
    async with app().run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "both 250")
        await until_waiting(rt, receipt.submission_id)
        outcomes = of(await rt.history("cashier", "c-1"), ToolOutcome)
        assert [o.name for o in outcomes] == ["note"]
        [wait] = await rt.waits()
        await rt.resolve("cashier", "c-1", wait.wait_id, True)
        await rt.read(receipt, timeout=10)
        outcomes = of(await rt.history("cashier", "c-1"), ToolOutcome)
        assert sorted(o.name for o in outcomes) == ["note", "refund"]
    assert ran(log, "note") == 1  # kept, not run again after the wait


async def test_state_written_before_the_pause_commits_with_the_resumed_batch(log: Path) -> None:
    async with app().run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "both 250")
        await until_waiting(rt, receipt.submission_id)
        assert await rt.store.get_state("cashier/c-1") == {}  # the batch has not committed
        [started] = of(await rt.history("cashier", "c-1"), WaitStarted)
        assert started.state_writes == {"notes": 1}
        [wait] = await rt.waits()
        await rt.resolve("cashier", "c-1", wait.wait_id, True)
        await rt.read(receipt, timeout=10)
        assert await rt.store.get_state("cashier/c-1") == {"notes": 1}
        await assert_invariants(rt.store)
    assert ran(log, "note") == 1


async def test_an_answer_sent_before_its_wait_is_recorded_is_held_and_given_once_it_is() -> None:
    """The approver answered the link while a sibling call still ran: 404 wait_not_found, and
    the answer was lost (the id is documented as one to send before waiting)."""
    early = EarlyWaits()
    async with early.app.run() as rt:
        receipt = await rt.dispatch("early", "c-1", "go")
        _, wait_id = await asyncio.to_thread(early.first_asked)
        answering = asyncio.ensure_future(rt.resolve("early", "c-1", wait_id, {"ok": True}))
        await asyncio.sleep(0.3)
        assert not answering.done()  # held: the batch has not paused yet
        assert await rt.waits() == []
        early.release.set()
        wait = await asyncio.wait_for(answering, 10)
        assert (wait.wait_id, wait.submission_id) == (wait_id, receipt.submission_id)
        assert (await rt.read(receipt, timeout=10)).text == "done"
        [resolved] = of(await rt.history("early", "c-1"), WaitResolved)
        assert resolved.value == {"ok": True}
        await assert_invariants(rt.store)


async def test_an_early_answer_to_a_delegated_tasks_wait_is_held_while_its_parent_runs() -> None:
    """The task's conversation has no submission of its own (its parent's runs it): the answer
    was refused at once with 404, although the wait was about to be recorded."""
    early = EarlyWaits()
    async with early.app.run() as rt:
        receipt = await rt.dispatch("boss", "c-1", "delegate")
        where, wait_id = await asyncio.to_thread(early.first_asked)
        agent, _, child = where.partition("/")
        assert agent == "early" and child.startswith("c-1.task-")
        answering = asyncio.ensure_future(rt.resolve(agent, child, wait_id, "yes"))
        await asyncio.sleep(0.3)
        assert not answering.done()
        early.release.set()
        wait = await asyncio.wait_for(answering, 10)
        assert wait.submission_id == receipt.submission_id
        assert (await rt.read(receipt, timeout=10)).text == "boss done"


async def test_past_so_many_held_answers_one_more_is_not_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hearth.runtime.runtime.EARLY_ANSWERS_HELD", 2)
    early = EarlyWaits()
    async with early.app.run() as rt:
        receipt = await rt.dispatch("early", "c-1", "go")
        await asyncio.to_thread(early.first_asked)
        held = [
            asyncio.ensure_future(rt.resolve("early", "c-1", f"w_{n:024x}", True)) for n in (1, 2)
        ]
        await asyncio.sleep(0.3)
        assert rt.early_answers == 2 and not any(h.done() for h in held)
        with pytest.raises(hearth.WaitNotFound):  # at once
            await rt.resolve("early", "c-1", f"w_{3:024x}", True)
        early.release.set()
        await until_waiting(rt, receipt.submission_id)
        for h in held:  # (the batch paused without them: nothing runs to record them)
            with pytest.raises(hearth.WaitNotFound):
                await asyncio.wait_for(h, 10)
        assert rt.early_answers == 0


async def test_an_unknown_wait_of_a_conversation_with_nothing_running_is_refused_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hearth.runtime.runtime.EARLY_ANSWER_S", 600.0)
    early = EarlyWaits()
    async with early.app.run() as rt:
        receipt = await rt.dispatch("early", "c-1", "go")
        _, wait_id = await asyncio.to_thread(early.first_asked)
        early.release.set()
        await until_waiting(rt, receipt.submission_id)
        async with asyncio.timeout(10):  # not held: nothing of the conversation runs
            with pytest.raises(hearth.WaitNotFound):
                await rt.resolve("early", "c-1", "w_" + "0" * 24, True)
        await rt.resolve("early", "c-1", wait_id, True)
        await rt.read(receipt, timeout=10)


async def test_waiting_consumes_no_attempt_of_the_budget() -> None:
    # cashier has max_attempts=1; a call that waits twice takes three attempts and completes.
    async with app().run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "twice")
        for expected in ("first", "second"):
            await until_waiting(rt, receipt.submission_id)
            [wait] = await rt.waits()
            assert wait.name == expected
            await rt.resolve("cashier", "c-1", wait.wait_id, expected.upper())
        answer = await rt.read(receipt, timeout=10)
        assert answer.text == "done: ['FIRST', 'SECOND']"
        sub = await rt.submission(receipt.submission_id)
        assert (sub.attempt, sub.waits, sub.interruptions) == (3, 2, 1)


async def test_time_spent_waiting_does_not_count_toward_the_deadline() -> None:
    @hearth.agent(durability=hearth.Durability(timeout=1.0))
    def hasty(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/cashier")
        ctx.use_tool(waitapp.refund)
        return "Be quick."

    quick = hearth.App([hasty], db="memory", providers=waitapp.MODELS)
    async with quick.run() as rt:
        receipt = await rt.dispatch("hasty", "c-1", "refund 250")
        await until_waiting(rt, receipt.submission_id)
        before = (await rt.submission(receipt.submission_id)).deadline
        await asyncio.sleep(1.5)  # past the 1 s timeout, but waiting
        [wait] = await rt.waits()
        await rt.resolve("hasty", "c-1", wait.wait_id, True)
        answer = await rt.read(receipt, timeout=10)
        assert answer.outcome == "completed"
        after = (await rt.submission(receipt.submission_id)).deadline
        assert before is not None and after is not None and after - before >= 1.4


async def test_a_wait_inside_a_delegated_task_pauses_the_parent_submission(log: Path) -> None:
    async with app().run() as rt:
        receipt = await rt.dispatch("desk", "d-1", "delegate 300")
        await until_waiting(rt, receipt.submission_id)
        [wait] = await rt.waits()
        assert wait.agent == "cashier" and wait.submission_id == receipt.submission_id
        await rt.resolve(wait.agent, wait.id, wait.wait_id, "ok")
        answer = await rt.read(receipt, timeout=10)
        assert "'refunded': 300" in answer.text
        await assert_invariants(rt.store)
    assert (ran(log, "step-load"), ran(log, "step-pay")) == (1, 1)


async def test_settle_all_returns_once_the_work_waits_for_a_wait_without_a_timeout() -> None:
    """``settle_all`` waited for the running submission's settlement: one that started waiting
    instead (at rest, by its own docstring) held it for its whole timeout."""
    async with app().run() as rt:
        receipt = await rt.dispatch("desk", "d-1", "delegate 300")  # the wait is the child's
        async with asyncio.timeout(20):  # far less than the 600 s it was given
            await rt.settle_all(timeout=600)
        assert (await rt.submission(receipt.submission_id)).status == "waiting"


async def test_a_value_that_is_not_json_or_not_text_is_refused() -> None:
    async with app().run() as rt:
        receipt = await rt.dispatch("cashier", "c-1", "refund 250")
        await until_waiting(rt, receipt.submission_id)
        [wait] = await rt.waits()
        with pytest.raises(hearth.InvalidInput):
            await rt.resolve("cashier", "c-1", wait.wait_id, {1, 2})
        with pytest.raises(hearth.InvalidInput, match="surrogate"):  # no UTF-8 form
            await rt.resolve("cashier", "c-1", wait.wait_id, {"note": "cut \ud83d"})
        deep: list[Any] = []
        for _ in range(3000):  # a bare RecursionError before
            deep = [deep]
        with pytest.raises(hearth.InvalidInput, match="not JSON"):
            await rt.resolve("cashier", "c-1", wait.wait_id, deep)
        [still] = await rt.waits()
        assert still.wait_id == wait.wait_id  # still pending: nothing was resolved


@pytest.mark.parametrize("timeout", [sys.maxsize, 1e300, 3.2e9, -1, float("inf"), "60"])
async def test_a_wait_timeout_no_date_can_end_is_the_tools_error(timeout: Any) -> None:
    """``sys.maxsize`` ("for ever") made an expiry past the year 9999: computing it failed every
    attempt of the submission, which ended as interrupted ten times."""

    async def record(name: str, value: Any, sets: Any) -> None:
        raise AssertionError("nothing is recorded")

    steps = Steps("call_1", {}, record)
    with pytest.raises(hearth.StepError, match="100 years"):
        await steps.wait("approve", timeout=timeout)


async def test_a_thousand_waiting_conversations_hold_no_tasks(tmp_path: Path) -> None:
    n = 1000
    async with app(db=str(tmp_path / "h.db")).run() as rt:
        await asyncio.sleep(0.2)  # the claim loop is idle, in its wait for work
        baseline = len(asyncio.all_tasks())
        gc.collect()
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        receipts = await asyncio.gather(
            *(rt.dispatch("cashier", f"c-{i}", "refund 500") for i in range(n))
        )
        end = time.monotonic() + 90
        while len(await rt.waits()) < n:
            assert time.monotonic() < end, "not every conversation got to its wait"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)  # let the last supervisors finish
        names = sorted(f"{t.get_name()}: {t.get_coro()}" for t in asyncio.all_tasks())
        tasks = len(names)
        gc.collect()
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(
            f"\n{n} waiting conversations: {tasks} asyncio tasks (baseline {baseline}),"
            f" max RSS +{(rss_after - rss_before) / 1024:.1f} MiB while getting there"
        )
        assert tasks <= baseline, names  # nothing per conversation: no claim, no timer, no watcher
        assert rt.coordinator.running == 0
        statuses = {(await rt.submission(r.submission_id)).status for r in receipts[:50]}
        assert statuses == {"waiting"}


async def test_a_wait_outside_a_durable_tool_is_not_possible() -> None:
    @hearth.tool
    async def plain(ctx: hearth.ToolContext) -> str:
        """No steps here."""
        assert not ctx.durable
        with pytest.raises(hearth.ConfigurationError, match="durable=True"):
            ctx.step  # noqa: B018 (reading it raises)
        return "plain"

    model = ScriptedModel("p", [calls(call("plain")), reply("ok")])

    @hearth.agent
    def p(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/p")
        ctx.use_tool(plain)
        return "x"

    async with hearth.App([p], db="memory", providers=[model]).run() as rt:
        receipt = await rt.dispatch("p", "c-1", "go")
        assert (await rt.read(receipt, timeout=10)).text == "ok"


async def test_a_wait_inside_a_task_group_pauses_the_call() -> None:
    """A task group gives hearth's pause back wrapped in an exception group: the call failed
    (``BaseExceptionGroup: unhandled errors in a TaskGroup``) and no wait was ever started."""

    @hearth.tool(durable=True)
    async def approve(ctx: hearth.ToolContext) -> dict[str, Any]:
        """Ask while loading."""
        async with asyncio.TaskGroup() as group:
            asked = group.create_task(ctx.step.wait("approval", prompt="ok?"))
            loaded = group.create_task(ctx.step.do("load", lambda: 42))
        return {"approval": asked.result(), "load": loaded.result()}

    model = ScriptedModel("g", [calls(call("approve")), reply("done")])

    @hearth.agent
    def g(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/g")
        ctx.use_tool(approve)
        return "x"

    async with hearth.App([g], db="memory", providers=[model]).run() as rt:
        receipt = await rt.dispatch("g", "c-1", "go")
        await until_waiting(rt, receipt.submission_id)
        [wait] = await rt.waits()
        await rt.resolve("g", "c-1", wait.wait_id, {"ok": True})
        assert (await rt.read(receipt, timeout=10)).text == "done"
        [outcome] = of(await rt.history("g", "c-1"), ToolOutcome)
        assert not outcome.is_error
        assert outcome.content == {"approval": {"ok": True}, "load": 42}


@pytest.mark.parametrize("names", [("s", "s"), ("y:s", "s")])
async def test_steps_and_waits_are_their_calls_own_whatever_the_ids_hold(
    names: tuple[str, str],
) -> None:
    """Ids with ':' (one provider gives ``functions.lookup:0``): calls ``x`` and ``x:y`` of
    one message. Step records were found by their id's prefix, so ``x``'s step replayed the
    value of ``x:y``'s after a wait; and step ``y:s`` of ``x`` had the id of step ``s`` of ``x:y``
    (an ``IntegrityError``)."""

    @hearth.tool(durable=True)
    async def t(ctx: hearth.ToolContext) -> str:
        """Step, then (call x) wait."""
        if ctx.tool_call_id == "x:y":
            await asyncio.sleep(0.1)  # its step comes after x's
        name = names[0] if ctx.tool_call_id == "x" else names[1]
        value = await ctx.step.do(name, lambda: f"value of {ctx.tool_call_id}")
        if ctx.tool_call_id == "x":
            await ctx.step.wait("w", prompt="go on?")
        return str(value)

    model = ScriptedModel("k", [calls(call("t", id="x"), call("t", id="x:y")), reply("done")])

    @hearth.agent
    def k(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/k")
        ctx.use_tool(t)
        return "x"

    async with hearth.App([k], db="memory", providers=[model]).run() as rt:
        receipt = await rt.dispatch("k", "c-1", "go")
        await until_waiting(rt, receipt.submission_id)
        [wait] = await rt.waits()
        await rt.resolve("k", "c-1", wait.wait_id, True)
        assert (await rt.read(receipt, timeout=10)).text == "done"
        outcomes = {
            o.tool_call_id: o.content for o in of(await rt.history("k", "c-1"), ToolOutcome)
        }
        assert outcomes == {"x": "value of x", "x:y": "value of x:y"}
        await assert_invariants(rt.store)


def test_wait_records_are_their_calls_own_whatever_the_ids_hold() -> None:
    """As steps: wait ``y:w`` of call ``x`` had the record id of wait ``w`` of call ``x:y``,
    and the waits call ``x`` had started included those of ``x:y``."""

    def started(call: str, name: str, wait_id: str) -> WaitStarted:
        pending = WaitPending(wait_id, name, None, None, started=False)
        return wait_started("m_1", call, pending, 0.0)[0]

    mine, theirs = started("x", "y:w", "w_1"), started("x:y", "w", "w_2")
    assert mine.id != theirs.id
    assert recorded_waits([mine, theirs], "m_1", "x")[0] == {"w_1"}
    assert recorded_waits([mine, theirs], "m_1", "x:y")[0] == {"w_2"}
