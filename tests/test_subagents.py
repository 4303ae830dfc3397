"""Delegated tasks: the built-in task tool runs a subagent in a child conversation."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

import hearth
from hearth.providers.base import ModelRequest, ToolResult, UserTurn
from hearth.receipts import ID_RE
from hearth.records import ChildConversationLinked, ConversationCreated, ToolOutcome
from hearth.runtime.scheduler import Scheduler
from hearth.runtime.tasks import MAX_DEPTH, child_id
from hearth.testing import ScriptedModel, Step, call, calls, reply, stream
from hearth.testing.clock import ManualClock

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def last_result(request: ModelRequest) -> ToolResult | None:
    last = request.messages[-1] if request.messages else None
    return last if isinstance(last, ToolResult) else None


@hearth.agent
def researcher(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/researcher")
    return "You research."


@hearth.agent
def lead(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/lead")
    ctx.use_subagent(researcher, description="Research a question in depth")
    return "You lead."


def lead_script(request: ModelRequest) -> Step:
    result = last_result(request)
    if result is None:
        return calls(call("task", agent="researcher", prompt="Find the capital of Norway"))
    return reply(f"the researcher said: {result.content}")


def researcher_script(request: ModelRequest) -> Step:
    prompt = next(str(m.content) for m in request.messages if isinstance(m, UserTurn))
    return reply(f"answer to '{prompt}': Oslo")


async def test_a_task_runs_the_subagent_in_its_own_conversation() -> None:
    models = [ScriptedModel("lead", lead_script), ScriptedModel("researcher", researcher_script)]
    app = hearth.App([lead, researcher], db="memory", providers=models)
    async with app.run() as rt:
        result = await rt.read(await rt.dispatch("lead", "p1", "go"), timeout=10)
        parent = await rt.history("lead", "p1")
        (link,) = [r for r in parent if isinstance(r, ChildConversationLinked)]
        agent, _, id = link.child_conversation_id.partition("/")
        child = await rt.history(agent, id)
    assert result.text == "the researcher said: answer to 'Find the capital of Norway': Oslo"
    (outcome,) = [r for r in parent if isinstance(r, ToolOutcome)]
    assert outcome.content == "answer to 'Find the capital of Norway': Oslo"
    assert link.offset < outcome.offset
    created = child[0]
    assert isinstance(created, ConversationCreated)
    assert created.parent == {"conversation_id": "lead/p1", "tool_call_id": link.tool_call_id}
    assert agent == "researcher" and ID_RE.match(id)
    task_spec = next(t for t in models[0].requests[0].tools if t.name == "task")
    assert task_spec.parameters["properties"]["agent"]["enum"] == ["researcher"]


async def test_an_unknown_subagent_name_is_an_error_outcome() -> None:
    def script(request: ModelRequest) -> Step:
        result = last_result(request)
        if result is None:
            return calls(call("task", agent="nobody", prompt="hi"))
        return reply(str(result.content["type"]))

    models = [ScriptedModel("lead", script), ScriptedModel("researcher", researcher_script)]
    app = hearth.App([lead, researcher], db="memory", providers=models)
    async with app.run() as rt:
        assert (await rt.read(await rt.dispatch("lead", "p", "go"), timeout=10)).text == (
            "subagent_missing"
        )


async def test_delegation_stops_at_depth_four() -> None:
    tools_seen: dict[str, list[str]] = {}

    def make(level: int, child: hearth.Agent | None) -> hearth.Agent:
        def render(ctx: hearth.AgentContext) -> str:
            ctx.use_model("scripted/level")
            if child is not None:
                ctx.use_subagent(child, description="the next level")
            return f"level {level}"

        return hearth.Agent(render, name=f"level{level}")

    chain: hearth.Agent | None = None
    for level in range(6, -1, -1):
        chain = make(level, chain)
    assert chain is not None

    def script(request: ModelRequest) -> Step:
        tools_seen[request.system] = [t.name for t in request.tools]
        result = last_result(request)
        if result is not None:
            return reply(f"{request.system} <- {result.content}")
        if any(t.name == "task" for t in request.tools):
            nxt = int(request.system.split()[1]) + 1
            return calls(call("task", agent=f"level{nxt}", prompt="go deeper"))
        return reply(f"{request.system} (bottom)")

    app = hearth.App([chain], db="memory", providers=[ScriptedModel("level", script)])
    async with app.run() as rt:
        text = (await rt.read(await rt.dispatch("level0", "x", "go"), timeout=20)).text
    assert text == "level 0 <- level 1 <- level 2 <- level 3 <- level 4 (bottom)"
    assert tools_seen[f"level {MAX_DEPTH}"] == []


def test_child_ids_are_deterministic_and_valid() -> None:
    a = child_id("lead/" + "x" * 128, "call_0_0")
    assert a == child_id("lead/" + "x" * 128, "call_0_0")
    assert a != child_id("lead/" + "x" * 128, "call_0_1")
    assert ID_RE.match(a)
    assert ID_RE.match(child_id("lead/p", "weird id/with spaces"))


async def test_a_child_runs_under_the_parents_deadline() -> None:
    from hearth.testing import stall

    @hearth.agent(durability=hearth.Durability(timeout=0.5))
    def hurried_lead(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/lead")
        ctx.use_subagent(researcher, description="Research")
        return ""

    models = [
        ScriptedModel("lead", lead_script),
        ScriptedModel("researcher", [stall(after_chunks=["thinking"])]),
    ]
    app = hearth.App([hurried_lead, researcher], db="memory", providers=models)
    async with app.run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as info:
            await rt.read(await rt.dispatch("hurried-lead", "p", "go"), timeout=10)
        parent = await rt.history("hurried-lead", "p")
        (link,) = [r for r in parent if isinstance(r, ChildConversationLinked)]
        child = await rt.history(*link.child_conversation_id.split("/", 1))
    assert info.value.type == "timeout"
    started = [r for r in child if r.type == "assistant_message_started"]
    closed = [r for r in child if r.type == "assistant_message_completed"]
    assert len(started) == len(closed) == 1  # the child was left at rest too
    assert closed[0].stop_reason == "aborted"
    assert info.value.interrupted_tools == [
        {
            "name": "task",
            "tool_call_id": link.tool_call_id,
            "child_conversation_id": link.child_conversation_id,
        }
    ]


async def test_a_delegated_tasks_conversation_takes_no_input_from_outside() -> None:
    """A message admitted to it ran beside the parent's task, in the same stream, and the
    task's answer became the answer to that message."""
    models = [ScriptedModel("lead", lead_script), ScriptedModel("researcher", researcher_script)]
    app = hearth.App([lead, researcher], db="memory", providers=models)
    async with app.run() as rt:
        await rt.read(await rt.dispatch("lead", "p1", "go"), timeout=10)
        parent = await rt.history("lead", "p1")
        (link,) = [r for r in parent if isinstance(r, ChildConversationLinked)]
        _, _, id = link.child_conversation_id.partition("/")
        message_id = link.id.split(":child:")[0]
        assert id == child_id("lead/p1", link.tool_call_id, message_id)
        for refused in (
            lambda: rt.dispatch("researcher", id, "hello child"),
            lambda: rt.dispatch("researcher", id, signal={"type": "poke"}),
        ):
            with pytest.raises(hearth.DelegatedConversation, match="delegated task"):
                await refused()
        # Nor an abort: it has no submission of its own (it answered "nothing aborted").
        with pytest.raises(hearth.DelegatedConversation, match="abort lead/p1"):
            await rt.abort("researcher", id)
        # An id that only looks a little like one is anyone's.
        assert (await rt.read(await rt.dispatch("researcher", "notes.task-1", "q"), 10)).outcome


async def test_channels_and_schedules_send_nothing_to_a_delegated_tasks_conversation() -> None:
    """Only ``dispatch`` refused it: a channel's delivery or a schedule's occurrence routed to
    it was admitted, and ran beside the parent's task."""
    target: list[str] = []

    def verify(headers: object, body: bytes) -> hearth.Delivery:
        return hearth.Delivery(id="d-1", type="note", data={})

    def receive(delivery: hearth.Delivery) -> hearth.Dispatch:
        return hearth.Dispatch(researcher, target[0], message="hello child")

    channel = hearth.Channel("notes", verify=verify, receive=receive)
    models = [ScriptedModel("lead", lead_script), ScriptedModel("researcher", researcher_script)]
    app = hearth.App([lead, researcher], channels=[channel], db="memory", providers=models)
    async with app.run() as rt:
        await rt.read(await rt.dispatch("lead", "p1", "go"), timeout=10)
        (link,) = [
            r for r in await rt.history("lead", "p1") if r.type == "child_conversation_linked"
        ]
        target.append(link.child_conversation_id.partition("/")[2])
        with pytest.raises(hearth.ChannelFailed, match="delegated task"):
            await rt.deliver("notes", {}, b"{}")
        (kept,) = await rt.deliveries("notes")
        assert kept.status == "failed" and kept.submission_ids == []

        clock = ManualClock(1_800_000_000.0)
        every = hearth.Schedule("poke", researcher, target[0], cron="* * * * *", message="m")
        scheduler = Scheduler(rt.env, [every], clock)
        await scheduler.tick()
        clock.advance(120)
        await scheduler.tick()
        assert scheduler.cursors["poke"] is None  # this process stopped firing it
        assert len(await rt.submissions()) == 1  # the parent's alone


async def test_a_tool_call_id_used_again_in_a_later_turn_gets_a_child_of_its_own() -> None:
    """The child was named by the parent and the call id alone: a model that used an id again
    in a later turn (a local server counting from 0 each turn) had the second task answered by
    the first one's child, silently; in a later submission it failed with IntegrityError."""
    asked: list[str] = []

    def lead_again(request: ModelRequest) -> Step:
        last_user = max(i for i, m in enumerate(request.messages) if isinstance(m, UserTurn))
        results = [m for m in request.messages[last_user:] if isinstance(m, ToolResult)]
        if len(results) >= 2:
            return reply(" | ".join(str(r.content) for r in results))
        prompt = f"question {len(results) + 1}"
        return calls(call("task", agent="researcher", prompt=prompt, id="t1"))

    def answer(request: ModelRequest) -> Step:
        prompt = next(str(m.content) for m in request.messages if isinstance(m, UserTurn))
        asked.append(prompt)
        return reply(f"answer to {prompt}")

    models = [ScriptedModel("lead", lead_again), ScriptedModel("researcher", answer)]
    app = hearth.App([lead, researcher], db="memory", providers=models)
    async with app.run() as rt:
        first = await rt.read(await rt.dispatch("lead", "p1", "go"), timeout=10)
        second = await rt.read(await rt.dispatch("lead", "p1", "again"), timeout=10)
    assert first.text == second.text == "answer to question 1 | answer to question 2"
    assert asked == ["question 1", "question 2", "question 1", "question 2"]


@hearth.tool(durable=True)
async def approve(ctx: hearth.ToolContext) -> str:
    """Ask a person."""
    return f"approved {await ctx.step.wait('ok', prompt='approve?')}"


@hearth.agent
def clerk(ctx: hearth.AgentContext) -> str:  # given to use_subagent only, not to the App
    ctx.use_model("scripted/clerk")
    ctx.use_tool(approve)
    return "You get approvals."


@hearth.agent
def manager(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/manager")
    ctx.use_subagent(clerk, description="Gets approvals")
    return "You manage."


def answering(first: Step) -> Callable[[ModelRequest], Step]:
    """A script: ``first``, then a reply with the last tool result."""

    def script(request: ModelRequest) -> Step:
        result = last_result(request)
        return first if result is None else reply(str(result.content))

    return script


async def test_the_conversation_of_a_subagent_the_app_does_not_list_is_read_and_resolved() -> None:
    """Its wait was listed but could not be resolved (no agent named 'clerk'), nor its stream
    read: the parent waited for good."""
    models = [
        ScriptedModel("manager", answering(calls(call("task", agent="clerk", prompt="x")))),
        ScriptedModel("clerk", answering(calls(call("approve")))),
    ]
    app = hearth.App([manager], db="memory", providers=models)
    async with app.run() as rt:
        receipt = await rt.dispatch("manager", "p", "go")
        for _ in range(500):
            if waits := await rt.waits():
                break
            await anyio.sleep(0.01)
        (wait,) = waits
        agent, _, id = wait.conversation_id.partition("/")
        assert agent == "clerk"
        assert [r.type for r in await rt.history(agent, id)][:1] == ["conversation_created"]
        await rt.resolve(agent, id, wait.wait_id, "yes")
        assert (await rt.read(receipt, timeout=10)).text == "approved yes"
        # No direct input (as for any delegated conversation: it answered "unknown agent"),
        # no new conversation.
        with pytest.raises(hearth.DelegatedConversation):
            await rt.dispatch("clerk", id, "hi")
        with pytest.raises(hearth.UnknownAgent):
            await rt.dispatch("clerk", "never-made", "hi")
        with pytest.raises(hearth.UnknownAgent):
            await rt.history("clerk", "never-made")
        # Its submissions are read by address, and the list is filtered by its agent (both
        # answered "unknown agent").
        sid = receipt.submission_id
        with pytest.raises(hearth.SubmissionNotFound):  # its parent's, not its own
            await rt.conversation_submission("clerk", id, sid)
        assert await rt.listed_agent("clerk") and not await rt.listed_agent("nobody")


async def test_an_abort_reconciles_the_calls_of_a_subagent_the_app_does_not_list() -> None:
    """Its calls kept the interrupted marker: only the App's agents were rendered at rest."""
    asked: list[str] = []

    def charged(call: hearth.ReconcileCall) -> hearth.Done:
        asked.append(call.tool_call_id)
        return hearth.Done({"charged": True})

    @hearth.tool(reconcile=charged)
    async def charge() -> dict[str, bool]:
        """Charge the card."""
        await anyio.sleep(30)
        return {"charged": True}

    @hearth.agent
    def cashier(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/cashier")
        ctx.use_tool(charge)
        return "You charge."

    @hearth.agent
    def shop(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/shop")
        ctx.use_subagent(cashier, description="Charges cards")
        return "You sell."

    models = [
        ScriptedModel("shop", answering(calls(call("task", agent="cashier", prompt="x")))),
        ScriptedModel("cashier", answering(calls(call("charge")))),
    ]
    app = hearth.App([shop], db="memory", providers=models)
    async with app.run() as rt:
        receipt = await rt.dispatch("shop", "p", "go")
        for _ in range(500):
            parent = await rt.history("shop", "p")
            links = [r for r in parent if isinstance(r, ChildConversationLinked)]
            if links and any(
                r.type == "assistant_tool_call"
                for r in await rt.store.read(links[0].child_conversation_id)
            ):
                break
            await anyio.sleep(0.01)
        await rt.abort("shop", "p")
        with pytest.raises(hearth.SubmissionAborted):
            await rt.read(receipt, timeout=10)
        child = await rt.store.read(links[0].child_conversation_id)
    (outcome,) = [r for r in child if isinstance(r, ToolOutcome)]
    assert len(asked) == 1
    assert (outcome.reconciled, outcome.content) == ("done", {"charged": True})


async def test_a_tasks_outcome_says_how_long_it_ran() -> None:
    """``duration_ms`` of a ``task`` call was always 0 (ordinary tools' say their time)."""

    def slow_researcher(request: ModelRequest) -> Step:
        return stream("Os", "lo", delay=0.06)  # at least 0.12 s

    models = [ScriptedModel("lead", lead_script), ScriptedModel("researcher", slow_researcher)]
    app = hearth.App([lead, researcher], db="memory", providers=models)
    async with app.run() as rt:
        await rt.read(await rt.dispatch("lead", "p1", "go"), timeout=10)
        (outcome,) = [r for r in await rt.history("lead", "p1") if isinstance(r, ToolOutcome)]
    assert outcome.content == "Oslo"
    assert outcome.duration_ms >= 120
