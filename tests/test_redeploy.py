"""The redeploy check's judgement (``hearth.redeploy``), case by case, on a real SQLite file
holding what a crashed attempt left: a tool call in flight, with or without a recorded step."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import hearth
from hearth.agent import Agent
from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantToolCall,
    Record,
    StateWrite,
    ToolStepSettled,
    UserMessage,
)
from hearth.redeploy import Report, check_store
from hearth.store import NewSubmission, Store, Submission
from hearth.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio
CONV = "shop/c-1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    made = SQLiteStore(str(tmp_path / "h.db"))
    await made.open()
    yield made
    await made.close()


@hearth.tool(durable=True)
async def ship(ctx: hearth.ToolContext) -> str:
    """Ship."""
    return "shipped"


@hearth.tool
async def ship_plain() -> str:
    """Ship, ordinarily."""
    return "shipped"


def shop(declare: object = None, *, raises: bool = False) -> dict[str, Agent]:
    """A version of the agent ``shop`` that declares ``declare`` as ``ship`` when its state's
    ``mode`` is ``"ship"`` (or always, with ``declare`` given as ``"always"``)."""

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/x")
        mode, _ = ctx.use_state("mode", None)
        if raises:
            raise RuntimeError("broken")
        if declare == "always" or mode == "ship":
            ctx.use_tool(ship)
        return "Shop."

    return {"shop": hearth.Agent(render, name="shop")}


async def in_flight(
    store: Store, *, step: bool = True, state: dict[str, str] | None = None
) -> Submission:
    """A submission whose attempt 1 called ``ship`` (and maybe recorded a step), then died."""
    sub = (await store.admit(NewSubmission(CONV, "shop", "message", {"message": "go"}))).submission
    if state:
        writes = [StateWrite(id=f"w:{k}", name=k, value=v) for k, v in state.items()]
        await store.append(CONV, writes)
    [sub] = await store.claim("owner", 30.0, 1)
    records: list[Record] = [
        UserMessage(id=f"{sub.id}:input", message_id=sub.id, content="go"),
        AssistantMessageStarted(id="m1:started", message_id="m1", model="x"),
        AssistantToolCall(id="m1:call", message_id="m1", tool_call_id="call-1", name="ship",
                          arguments={}),
        AssistantMessageCompleted(id="m1:completed", message_id="m1", stop_reason="tool_use"),
    ]  # fmt: skip
    if step:
        records.append(ToolStepSettled(id="call-1:label", tool_call_id="call-1", step="label",
                                       value="ok"))  # fmt: skip
    await store.append(CONV, [r.stamped(sub.id, sub.attempt) for r in records], fence=sub.fence)
    return sub


def kinds(report: Report) -> list[str]:
    return [f.kind for s in report.submissions for f in s.findings]


async def test_a_durable_tool_still_declared_durable_is_no_finding(store: Store) -> None:
    await in_flight(store)
    report = await check_store(store, shop("always"))
    assert (kinds(report), report.withdrawn, len(report.submissions)) == ([], False, 1)


async def test_a_durable_tool_no_longer_declared_is_withdrawn(store: Store) -> None:
    await in_flight(store)
    report = await check_store(store, shop())
    assert kinds(report) == ["durable_tool_withdrawn"] and report.withdrawn


async def test_the_agent_is_rendered_with_its_conversations_state(store: Store) -> None:
    await in_flight(store, state={"mode": "ship"})
    assert kinds(await check_store(store, shop())) == []  # its state makes it declare ship


async def test_a_removed_tool_without_durable_evidence_counts_as_withdrawn(store: Store) -> None:
    await in_flight(store, step=False)
    assert kinds(await check_store(store, shop())) == ["tool_removed"]


async def test_an_ordinary_tool_still_declared_is_no_finding(store: Store) -> None:
    await in_flight(store, step=False)

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/x")
        ctx.use_tool(hearth.tool(name="ship")(ship_plain.fn))
        return "Shop."

    assert kinds(await check_store(store, {"shop": hearth.Agent(render, name="shop")})) == []


async def test_a_removed_agent_is_withdrawn_unless_the_work_ends_the_same_anyway(
    store: Store,
) -> None:
    await in_flight(store)
    assert kinds(await check_store(store, {})) == ["agent_removed"]
    await store.request_abort(CONV)
    assert kinds(await check_store(store, {})) == []  # it settles aborted under any code


async def test_a_render_that_raises_is_reported_but_withdraws_nothing(store: Store) -> None:
    await in_flight(store)
    report = await check_store(store, shop(raises=True))
    assert kinds(report) == ["render_failed"] and not report.withdrawn
    assert "RuntimeError: broken" in report.lines()[0]


async def test_queued_work_of_a_removed_agent_is_reported(store: Store) -> None:
    await store.admit(NewSubmission(CONV, "shop", "message", {"message": "later"}))
    report = await check_store(store, {})
    assert kinds(report) == ["agent_removed"]
    assert report.submissions[0].status == "queued"
