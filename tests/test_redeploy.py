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
    Compaction,
    Record,
    StateWrite,
    ToolStepSettled,
    UserMessage,
    WaitStarted,
)
from hearth.redeploy import Report, check_store
from hearth.runtime.outcomes import rerun_started
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


async def test_a_durable_tool_that_no_longer_takes_the_calls_arguments_is_withdrawn(
    store: Store,
) -> None:
    """Recovery validates the recorded arguments again before it re-executes: a tool that now
    requires another one gave the call a validation error and dropped its recorded steps, and
    the check said nothing."""

    @hearth.tool(name="ship", durable=True)
    async def ship_by(carrier: str, ctx: hearth.ToolContext) -> str:
        """Ship with a carrier."""
        return carrier

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/x")
        ctx.use_tool(ship_by)
        return "Shop."

    await in_flight(store)
    report = await check_store(store, {"shop": hearth.Agent(render, name="shop")})
    assert kinds(report) == ["durable_tool_withdrawn"] and report.withdrawn
    (finding,) = report.submissions[0].findings
    assert "no longer takes the arguments of call call-1" in finding.message
    assert "carrier" in finding.message


def plain_shop() -> dict[str, Agent]:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/x")
        ctx.use_tool(hearth.tool(name="ship")(ship_plain.fn))
        return "Shop."

    return {"shop": hearth.Agent(render, name="shop")}


async def test_an_ordinary_call_run_again_after_not_done_is_no_evidence_of_durability(
    store: Store,
) -> None:
    """The record that counts a reconciled call's one run again is a step record: it was read
    as the tool having been durable, and the unchanged code was reported withdrawing it (and
    ``serve --strict`` refused to start)."""
    sub = await in_flight(store, step=False)
    call = AssistantToolCall(
        id="m1:call", message_id="m1", tool_call_id="call-1", name="ship", arguments={}
    )
    await store.append(CONV, [rerun_started(call).stamped(sub.id, 1)], fence=sub.fence)
    assert kinds(await check_store(store, plain_shop())) == []


async def test_a_submission_whose_own_loop_compacted_is_checked_from_its_input(
    store: Store,
) -> None:
    """The check read from the compaction's cut, where the input is not: it found no input,
    judged the work not started and reported nothing, while recovery marked the durable call
    and dropped its recorded step."""
    sub = (await store.admit(NewSubmission(CONV, "shop", "message", {"message": "go"}))).submission
    [sub] = await store.claim("owner", 30.0, 1)
    start = await store.last_offset(CONV) + 1
    records: list[Record] = [
        UserMessage(id=f"{sub.id}:input", message_id=sub.id, content="go"),  # start
        AssistantMessageStarted(id="m0:started", message_id="m0", model="x"),
        AssistantMessageCompleted(id="m0:completed", message_id="m0", stop_reason="length"),
        Compaction(id="k1", summary="so far", first_kept_offset=start + 4, kept_offsets=[start]),
        AssistantMessageStarted(id="m1:started", message_id="m1", model="x"),  # start + 4
        AssistantToolCall(id="m1:call", message_id="m1", tool_call_id="call-1", name="ship",
                          arguments={}),
        AssistantMessageCompleted(id="m1:completed", message_id="m1", stop_reason="tool_use"),
        ToolStepSettled(id="call-1:label", tool_call_id="call-1", step="label", value="ok"),
    ]  # fmt: skip
    await store.append(CONV, [r.stamped(sub.id, sub.attempt) for r in records], fence=sub.fence)
    assert kinds(await check_store(store, shop("always"))) == []
    assert kinds(await check_store(store, shop())) == ["durable_tool_withdrawn"]


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


async def test_pending_waits_are_read_once_not_once_per_waiting_submission(store: Store) -> None:
    """Every pending wait was read again for each waiting submission: 10,000 waits took longer
    than any deploy waits."""
    for n in range(150):
        conversation = f"support/w-{n}"
        await store.admit(NewSubmission(conversation, "support", "message", {"text": "hi"}))
        (sub,) = await store.claim("owner-1", 30.0, 1)
        wait = WaitStarted(
            id=f"m{n}:wait",
            submission_id=sub.id,
            attempt=sub.attempt,
            wait_id=f"w_{n}",
            tool_call_id="call-1",
            name="approval",
            prompt="ok?",
        )
        await store.begin_wait(sub.fence, [(conversation, wait)])
    reads = 0
    list_waits = store.list_waits

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal reads
        reads += 1
        return await list_waits(*args, **kwargs)  # type: ignore[arg-type]

    store.list_waits = counted  # type: ignore[method-assign]
    report = await check_store(store, {})
    assert len(report.submissions) == 150
    assert reads <= 3  # pages of 100


def test_a_wait_is_matched_to_its_call_in_its_own_conversation() -> None:
    """Waits were keyed by tool call id alone: a provider numbering its calls from 0 in each
    conversation gives a parent's call and its child's the same id, and the parent's removed
    tool was reported as orphaning the child's wait."""
    from hearth.redeploy import TOOL_REMOVED, WAIT_ORPHANED, _Reader
    from hearth.store.rows import Wait

    child = "clerk/p.task-0123456789abcdef"
    wait = Wait(
        conversation_id=child,
        wait_id="w_1",
        submission_id="s_1",
        tool_call_id="call_0_0",
        name="approval",
        prompt=None,
        expires_at=None,
        created_at=0.0,
        state="pending",
    )
    reader = _Reader(None, None, 0.0, {(child, "call_0_0"): wait}, [])  # type: ignore[arg-type]
    call = AssistantToolCall(
        id="m1:call", message_id="m1", tool_call_id="call_0_0", name="gone", arguments={}
    )
    in_parent = reader._marked("manager/p", call, {}, False)
    in_child = reader._marked(child, call, {}, False)
    assert in_parent is not None and in_parent.kind == TOOL_REMOVED
    assert in_child is not None and in_child.kind == WAIT_ORPHANED
