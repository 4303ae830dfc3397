"""The spending budget (SPEC §18): ``Durability(max_tokens=N)`` bounds the model tokens one
submission spends across its turns, its attempts and its delegated children, counted from the
records, so that a crash cannot reset it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import budgetapp
import pytest

import hearth
from hearth.providers.base import ModelRequest
from hearth.records import (
    AssistantMessageCompleted,
    Compaction,
    Record,
    SubmissionSettled,
    ToolOutcome,
    UserMessage,
)
from hearth.runtime.budget import Spending, usage_tokens
from hearth.runtime.compaction import SUMMARY_PROMPT
from hearth.runtime.journal import Journal
from hearth.runtime.recovery import Action, Evidence, classify_recovery
from hearth.store.base import Fence
from hearth.testing import ScriptedModel, Step, overflow, reply
from hearth.testing.crash import CrashHarness

APPS = Path(__file__).resolve().parent / "apps"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def spent(records: list[Record], submission_id: str) -> list[int]:
    """The tokens of each model turn of the submission, in order."""
    return [
        usage_tokens(r.usage)
        for r in records
        if isinstance(r, AssistantMessageCompleted) and r.submission_id == submission_id
    ]


def test_max_tokens_must_be_a_positive_integer() -> None:
    assert hearth.Durability(max_tokens=5).max_tokens == 5
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(hearth.ConfigurationError, match="max_tokens"):
            hearth.Durability(max_tokens=bad)  # type: ignore[arg-type]


def evidence(**fields: Any) -> Evidence:
    base: dict[str, Any] = dict(
        records=[],
        input_appended=True,
        attempt=1,
        max_attempts=10,
        deadline_passed=False,
        abort_requested=False,
    )
    return Evidence(**(base | fields))


def test_past_the_budget_a_turn_boundary_settles_failed_budget_exhausted() -> None:
    records = [UserMessage(id="s:input", message_id="s", content="go")]
    assert classify_recovery(evidence(records=records)).action is Action.CONTINUE
    within = evidence(records=records, tokens_spent=99, max_tokens=100)
    assert classify_recovery(within).action is Action.CONTINUE
    past = classify_recovery(evidence(records=records, tokens_spent=100, max_tokens=100))
    assert past.action is Action.SETTLE_FAILED
    assert past.error is not None and past.error["type"] == "budget_exhausted"


@pytest.mark.anyio
async def test_a_tool_loop_stops_at_the_first_turn_boundary_past_its_budget() -> None:
    app = hearth.App(budgetapp.AGENTS, db="memory", providers=budgetapp.MODELS)
    async with app.run() as rt:
        receipt = await rt.dispatch("researcher", "r-1", "find it")
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(receipt, timeout=30)
        assert failed.value.type == "budget_exhausted"
        records = await rt.history("researcher", "r-1")
    turns = spent(records, receipt.submission_id)
    assert len(turns) >= 2
    assert sum(turns[:-1]) < budgetapp.MAX_TOKENS <= sum(turns)
    # The partial work stays: every turn's tool call has its outcome, and the batch committed.
    assert sum(isinstance(r, ToolOutcome) for r in records) == len(turns)
    assert str(sum(turns)) in failed.value.error["message"]


@pytest.mark.anyio
async def test_a_delegated_childs_turns_count_toward_the_parents_budget() -> None:
    app = hearth.App(budgetapp.AGENTS, db="memory", providers=budgetapp.MODELS)
    async with app.run() as rt:
        receipt = await rt.dispatch("lead", "l-1", "find it")
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(receipt, timeout=60)
        assert failed.value.type == "budget_exhausted"
        parent = await rt.history("lead", "l-1")
        child_id = next(
            r.child_conversation_id for r in parent if r.type == "child_conversation_linked"
        )
        agent, _, id = child_id.partition("/")
        child = await rt.history(agent, id)
    # The child runs under its parent's budget: its turns count, and it stops at the first
    # boundary past the budget; the parent's task gets an error outcome, and the parent stops
    # at its own next boundary without another model call.
    own = spent(parent, receipt.submission_id)
    delegated = spent(child, receipt.submission_id)
    assert len(own) == 1 and len(delegated) >= 2
    total = sum(own) + sum(delegated)
    assert total - delegated[-1] < budgetapp.MAX_TOKENS <= total
    assert str(total) in failed.value.error["message"]
    [task] = [r for r in parent if isinstance(r, ToolOutcome)]
    assert task.is_error and "budget" in str(task.content)


@pytest.mark.crash
def test_a_sigkill_between_turns_does_not_reset_the_count(tmp_path: Path) -> None:
    harness = CrashHarness(
        "budgetapp:app",
        db=tmp_path / "h.db",
        env={"HEARTH_TEST_LOG": str(tmp_path / "tools.log")},
        pythonpath=[APPS],
    )
    first = harness.run(
        dispatch=[("researcher", "r-1", "find it")], crash_at="after:tool_results_committed#3"
    )
    assert first.killed
    harness.run_until_settled()
    [sub] = harness.submissions("researcher/r-1")
    assert (sub.outcome, (sub.error or {}).get("type"), sub.attempt) == (
        "failed",
        "budget_exhausted",
        2,
    )
    records = harness.history("researcher/r-1")
    turns = spent(records, sub.id)
    attempts = {r.attempt for r in records if isinstance(r, AssistantMessageCompleted)}
    assert attempts == {1, 2}  # the count went on across the crash
    assert sum(turns[:-1]) < budgetapp.MAX_TOKENS <= sum(turns)
    [settled] = [r for r in records if isinstance(r, SubmissionSettled)]
    assert settled.error is not None and settled.error["type"] == "budget_exhausted"
    harness.assert_invariants()


@pytest.mark.anyio
async def test_a_compaction_summary_carries_its_usage_and_counts() -> None:
    def script(request: ModelRequest) -> Step:
        if request.system == SUMMARY_PROMPT:
            return reply("a summary of the greeting")
        if request.summary is None and len(request.messages) > 1:
            return overflow()
        return reply("ok")

    @hearth.agent
    def talker(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/talker")
        return "Talk."

    app = hearth.App([talker], db="memory", providers=[ScriptedModel("talker", script)])
    async with app.run() as rt:
        await rt.read(await rt.dispatch("talker", "t-1", "hello"), timeout=10)
        second = await rt.dispatch("talker", "t-1", "again")
        await rt.read(second, timeout=10)
        records = await rt.history("talker", "t-1")
        [compaction] = [r for r in records if isinstance(r, Compaction)]
        assert compaction.submission_id == second.submission_id
        assert usage_tokens(compaction.usage) > 0
        journal = Journal(rt.store, "talker/t-1", Fence(second.submission_id, 1))
        await journal.load(-1)
        counted = await Spending(rt.store, second.submission_id, journal).count()
    turns = sum(spent(records, second.submission_id))
    assert counted == turns + usage_tokens(compaction.usage)


@pytest.mark.anyio
async def test_the_children_of_one_batch_are_each_counted_once() -> None:
    """The children of a batch run at once and count at their turn boundaries; two counts
    reading a child's new records at once each added them, so a budget that the records fit
    ran out early ("spent 2032 tokens; its budget is 1708", with 1,076 recorded)."""
    import asyncio

    from hearth.providers.base import ToolResult
    from hearth.testing import call, calls, stream

    def boss_script(request: ModelRequest) -> Step:
        if any(isinstance(m, ToolResult) for m in request.messages):
            return reply("both done")
        return calls(
            call("task", agent="helper", prompt="job A", id="ta"),
            call("task", agent="helper", prompt="job B", id="tb"),
        )

    @hearth.tool
    async def work(i: int) -> str:
        """Work a while."""
        await asyncio.sleep(0.01)
        return "r" * 200

    def helper_script(request: ModelRequest) -> Step:
        done = sum(1 for m in request.messages if isinstance(m, ToolResult))
        if done >= 4:
            return stream("fin", "ished", delay=0.01)
        return calls(call("work", i=done, id=f"w{done}"))

    def render_helper(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/child")
        ctx.use_tool(work)
        return "helper"

    helper = hearth.Agent(render_helper, name="helper")

    def boss(budget: int | None) -> hearth.Agent:
        def render(ctx: hearth.AgentContext) -> str:
            ctx.use_model("scripted/parent")
            ctx.use_subagent(helper, description="helps")
            return "boss"

        return hearth.Agent(render, name="boss", durability=hearth.Durability(max_tokens=budget))

    async def run(budget: int | None) -> tuple[str, int]:
        models = [ScriptedModel("parent", boss_script), ScriptedModel("child", helper_script)]
        async with hearth.App([boss(budget), helper], db="memory", providers=models).run() as rt:
            receipt = await rt.dispatch("boss", "c", "do both")
            answer = await rt.read(receipt, timeout=60)
            records = await rt.history("boss", "c")
            total = sum(spent(records, receipt.submission_id))
            for linked in [r for r in records if r.type == "child_conversation_linked"]:
                agent, _, id = linked.child_conversation_id.partition("/")
                total += sum(spent(await rt.history(agent, id), receipt.submission_id))
            return answer.text, total

    _, total = await run(None)
    assert (await run(total))[0] == "both done"  # the whole recorded spend fits the budget
