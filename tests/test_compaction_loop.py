"""Compaction inside a submission's own tool loop: a long agentic loop compacts as often as it
needs, its user messages stay verbatim, and no request passes the model's window.

Real SQLite files and the real runtime; the model is the scripted walker of
``tests/apps/compactapp.py``, which refuses any request past its window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compactapp import TASK, steps_walked, user_texts, walk, walker

import hearth
from hearth.providers.base import (
    AssistantTurn,
    ModelRequest,
    SystemNote,
    ToolCall,
    ToolResult,
    UserTurn,
    estimate_tokens,
)
from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantTextDelta,
    AssistantToolCall,
    Compaction,
    Record,
    ToolOutcome,
    ToolResultsCommitted,
    UserMessage,
)
from hearth.runtime.budget import usage_tokens
from hearth.runtime.compaction import (
    SUMMARY_ASK,
    SUMMARY_PROMPT,
    plan_compaction,
    summary_request,
    turn_boundaries,
)
from hearth.runtime.recovery import Action, Evidence, classify_recovery
from hearth.testing import ScriptedModel, Step, error, overflow, reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def walker_app(
    db: Path | str, model: ScriptedModel, tool: hearth.Tool = walk, **durability: Any
) -> hearth.App:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/walker")
        ctx.use_tool(tool)
        return "You walk routes."

    agent = hearth.Agent(render, name="walker", durability=hearth.Durability(**durability))
    url = db if isinstance(db, str) else f"sqlite:///{db}"
    return hearth.App([agent], db=url, providers=[model])


def of(records: list[Record], kind: type[Record]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


def turn_requests(model: ScriptedModel) -> list[ModelRequest]:
    return [r for r in model.requests if r.system != SUMMARY_PROMPT]


async def test_a_200_turn_tool_loop_compacts_as_often_as_it_needs(db_url: str) -> None:
    window = 1000
    model = ScriptedModel("walker", walker(200, window), context_window=window)
    async with walker_app(db_url, model).run() as rt:
        reply = await rt.read(await rt.dispatch("walker", "c1", TASK), timeout=120)
        records = await rt.history("walker", "c1")
    assert reply.text == "Arrived after 200 steps."
    compactions = of(records, Compaction)
    summaries = [r for r in model.requests if r.system == SUMMARY_PROMPT]
    print(f"\n200-turn loop, window {window}, {db_url[:8]}: {len(compactions)} compactions")
    assert len(compactions) >= 10
    assert len(summaries) == len(compactions)  # one summary call, one record, per compaction
    # Every request fits the window and shows the user's message verbatim.
    assert max(estimate_tokens(r) for r in model.requests) <= window
    assert all(TASK in user_texts(r) for r in model.requests)
    assert len(turn_requests(model)) == 201
    # Each compaction keeps the input and moves the cut forward, at a turn boundary.
    (task,) = of(records, UserMessage)
    starts = {r.offset for r in of(records, AssistantMessageStarted)}
    cuts = [c.first_kept_offset for c in compactions]
    assert cuts == sorted(set(cuts))
    for c in compactions:
        assert c.kept_offsets == [task.offset]
        assert c.first_kept_offset in starts
        assert c.submission_id == task.submission_id
        assert usage_tokens(c.usage) > 0
        assert c.tokens_before > 0
    # The walk never lost its place: every step walked exactly once, in order.
    assert [r.content["step"] for r in of(records, ToolOutcome)] == list(range(1, 201))


async def test_no_request_separates_a_tool_call_from_its_result(tmp_path: Path) -> None:
    window = 900
    model = ScriptedModel("walker", walker(40, window), context_window=window)
    async with walker_app(tmp_path / "h.db", model).run() as rt:
        await rt.read(await rt.dispatch("walker", "c1", TASK), timeout=60)
        records = await rt.history("walker", "c1")
    assert len(of(records, Compaction)) >= 2
    for request in model.requests:
        called = {c.id for m in request.messages for c in getattr(m, "tool_calls", ())}
        results = {m.tool_call_id for m in request.messages if isinstance(m, ToolResult)}
        assert results <= called
    # And every cut of every compaction falls where no call waits for its outcome.
    for c in of(records, Compaction):
        before = [r for r in records if r.offset < c.first_kept_offset]
        calls = {r.tool_call_id for r in before if isinstance(r, AssistantToolCall)}
        outcomes = {r.tool_call_id for r in before if isinstance(r, ToolOutcome)}
        assert calls == outcomes


async def test_a_message_joined_into_the_loop_stays_verbatim(tmp_path: Path) -> None:
    window = 1000
    extra = "Also count the bridges you cross."
    joined: list[Any] = []

    async def script(request: ModelRequest) -> Any:
        if steps_walked(request) == 5 and not joined and request.system != SUMMARY_PROMPT:
            joined.append(await rt.dispatch("walker", "c1", extra))  # joins at the boundary
        return walker(60, window)(request)

    model = ScriptedModel("walker", script, context_window=window)
    async with walker_app(tmp_path / "h.db", model).run() as rt:
        reply = await rt.read(await rt.dispatch("walker", "c1", TASK), timeout=60)
        (receipt,) = joined
        sub = await rt.submission(receipt.submission_id)
        records = await rt.history("walker", "c1")
    assert reply.text == "Arrived after 60 steps."
    assert (sub.status, sub.outcome) == ("joined", "completed")
    task, late = of(records, UserMessage)
    assert late.content == extra
    compactions = of(records, Compaction)
    assert compactions and all(late.offset < c.first_kept_offset for c in compactions)
    for c in compactions:
        assert c.kept_offsets == [task.offset, late.offset]
    after_join = [r for r in turn_requests(model) if steps_walked(r) > 6]
    assert after_join and all(user_texts(r) == [TASK, extra] for r in after_join)
    assert max(estimate_tokens(r) for r in model.requests) <= window


async def test_a_message_alone_larger_than_the_window_fails_with_context_overflow(
    tmp_path: Path,
) -> None:
    model = ScriptedModel("walker", walker(3, 1000), context_window=1000)
    async with walker_app(tmp_path / "h.db", model).run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(await rt.dispatch("walker", "c1", "x" * 5000), timeout=20)
    assert failed.value.type == "context_overflow"
    assert "1000-token window" in failed.value.error["message"]
    assert model.requests == []  # nothing was sent


async def test_a_short_request_the_provider_refuses_as_too_long_says_so(tmp_path: Path) -> None:
    """A server whose window is smaller than hearth's table (a local one) refused a short first
    message: the failure said the context "takes about 40 tokens, more than this model's
    128000-token window allows", and the provider's own words were lost."""
    said = "the request exceeds the available context size, try increasing it"
    model = ScriptedModel("walker", lambda request: overflow(said))
    async with walker_app(tmp_path / "h.db", model).run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(await rt.dispatch("walker", "c1", "summarise this"), timeout=20)
    message = failed.value.error["message"]
    assert failed.value.type == "context_overflow"
    assert said in message and "context_windows=" in message
    assert "window allows" not in message


async def test_compaction_summaries_count_toward_the_token_budget(tmp_path: Path) -> None:
    window = 1000
    model = ScriptedModel("walker", walker(200, window), context_window=window)
    async with walker_app(tmp_path / "h.db", model, max_tokens=20_000).run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(await rt.dispatch("walker", "c1", TASK), timeout=60)
        records = await rt.history("walker", "c1")
    assert failed.value.type == "budget_exhausted"
    compactions = of(records, Compaction)
    assert compactions
    spent = int(failed.value.error["message"].split()[3])
    turns = sum(usage_tokens(getattr(r, "usage", None)) for r in records)
    assert spent == turns  # turns and summaries alike
    assert spent > sum(usage_tokens(c.usage) for c in compactions) > 0


async def test_a_tool_result_larger_than_the_window_is_summarised_from_a_clipped_copy(
    tmp_path: Path,
) -> None:
    window = 1000

    @hearth.tool(name="walk")
    async def walk_into_a_forest(n: int) -> dict[str, Any]:
        """Walk step ``n`` of the route."""
        trees = "pine " * (3000 if n == 10 else 10)  # step 10 sees a forest: ~4,000 tokens
        return {"step": n, "seen": f"step {n}: {trees}"}

    model = ScriptedModel("walker", walker(30, window), context_window=window)
    async with walker_app(tmp_path / "h.db", model, walk_into_a_forest).run() as rt:
        reply = await rt.read(await rt.dispatch("walker", "c1", TASK), timeout=60)
        records = await rt.history("walker", "c1")
    assert reply.text == "Arrived after 30 steps."
    assert max(estimate_tokens(r) for r in model.requests) <= window
    clipped = [r for r in model.requests if "characters cut]" in str(r.messages)]
    assert len(clipped) == 1 and clipped[0].system == SUMMARY_PROMPT
    (compaction,) = of(records, Compaction)
    assert compaction.tokens_before > window  # the forest was sent to no one but the summary


def test_the_summary_call_clips_a_turn_too_long_for_it_and_keeps_the_call() -> None:
    call = AssistantTurn("", (ToolCall("c1", "walk", {"n": 1}),))
    messages = [UserTurn("go"), call, ToolResult("c1", "walk", {"seen": "x" * 20_000})]
    request, held = summary_request("m", None, messages, budget=700)
    assert estimate_tokens(request) <= 700
    assert held == 2  # the call and its result; the user's message is left out
    note, kept_call, result, ask = request.messages
    assert isinstance(note, SystemNote) and kept_call == call and ask == UserTurn(SUMMARY_ASK)
    assert isinstance(result, ToolResult) and "characters cut]" in result.content
    # What fits is sent whole, and never from a tool result on.
    request, held = summary_request("m", None, messages[1:], budget=100_000)
    assert held == 2 and request.messages[:2] == (call, messages[2])


# --- the plan and the retry rule, from hand-built records ----------------------------------------


def _loop(turns: int, parallel: int = 2) -> list[Record]:
    """A submission's input, then ``turns`` tool turns of ``parallel`` calls each."""
    out: list[Record] = [UserMessage(id="s:input", message_id="s", content="go")]
    for t in range(turns):
        mid = f"m{t}"
        ids = [f"c{t}_{k}" for k in range(parallel)]
        out.append(AssistantMessageStarted(id=f"{mid}:s", message_id=mid, model="x/y"))
        out += [
            AssistantToolCall(
                id=f"{mid}:{c}", message_id=mid, tool_call_id=c, name="t", arguments={}
            )
            for c in ids
        ]
        out.append(AssistantMessageCompleted(id=f"{mid}:d", message_id=mid, stop_reason="tool_use"))
        out += [
            ToolOutcome(
                id=f"{mid}:o{c}",
                message_id=mid,
                tool_call_id=c,
                name="t",
                is_error=False,
                content="r" * 200,
                duration_ms=1,
            )
            for c in reversed(ids)
        ]
        out.append(ToolResultsCommitted(id=f"{mid}:k", message_id=mid, tool_call_ids=ids))
    return [r.stamped("s", 1).with_offset(i + 10) for i, r in enumerate(out)]


def test_cuts_fall_only_between_tool_turns() -> None:
    records = _loop(6)
    starts = [r.offset for r in records if isinstance(r, AssistantMessageStarted)]
    assert turn_boundaries(records) == [*starts, records[-1].offset + 1]
    # A batch still waiting for an outcome offers no cut at its end.
    assert turn_boundaries(records[:-2])[-1] == starts[-1]


def test_the_plan_keeps_the_input_and_the_most_recent_turns_that_fit() -> None:
    records = _loop(10)
    plan = plan_compaction(records, records, room=300)
    assert plan is not None
    assert plan.kept_offsets == (records[0].offset,)
    kept_tail = [r for r in records if r.offset >= plan.first_kept_offset]
    assert isinstance(kept_tail[0], AssistantMessageStarted)
    assert 1 <= sum(isinstance(r, AssistantMessageStarted) for r in kept_tail) < 10
    assert records[0] in plan.shown and records[0] not in plan.summarised
    # Room for nothing: everything but the input is summarised.
    bare = plan_compaction(records, records, room=0)
    assert bare is not None and bare.first_kept_offset == records[-1].offset + 1
    # Nothing but the input: nothing to summarise.
    assert plan_compaction(records[:1], records[:1], room=0) is None


def test_a_second_compaction_without_progress_fails_with_context_overflow() -> None:
    records = _loop(3)
    ev = Evidence(
        records=records,
        input_appended=True,
        attempt=1,
        max_attempts=5,
        deadline_passed=False,
        abort_requested=False,
        over_budget=True,
    )
    assert classify_recovery(ev).action is Action.COMPACT
    compaction = Compaction(id="k", summary="s", first_kept_offset=records[-1].offset + 1)
    again = [*records, compaction.with_offset(records[-1].offset + 1)]
    d = classify_recovery(Evidence(**{**ev.__dict__, "records": again}))
    assert d.action is Action.SETTLE_FAILED and d.error is not None
    assert d.error["type"] == "context_overflow"
    # Once the compaction made room, the turn goes ahead.
    fits = classify_recovery(Evidence(**{**ev.__dict__, "records": again, "over_budget": False}))
    assert fits.action is Action.CONTINUE


async def test_the_next_submission_reads_only_what_the_last_compaction_keeps(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = 1000
    phase = {"turns": 60, "task": TASK}
    later = "Walk on until step 120."

    def script(request: ModelRequest) -> Any:
        return walker(phase["turns"], window, str(phase["task"]))(request)

    model = ScriptedModel("walker", script, context_window=window)
    async with walker_app(db_url, model).run() as rt:
        await rt.read(await rt.dispatch("walker", "c1", TASK), timeout=60)
        first = await rt.history("walker", "c1")
    last = of(first, Compaction)[-1]
    (task,) = of(first, UserMessage)
    assert last.kept_offsets == [task.offset]

    # A new process: the next submission reads the kept input and the tail, not the old loop.
    phase.update(turns=120, task=later)
    model.requests.clear()
    app = walker_app(db_url, model)
    async with app.run() as rt:
        reads: list[int] = []
        real_read = rt.store.read

        async def counting_read(conversation_id: str, after: int = -1, limit: Any = None) -> Any:
            records = await real_read(conversation_id, after=after, limit=limit)
            reads.append(len(records))
            return records

        monkeypatch.setattr(rt.store, "read", counting_read)
        reply = await rt.read(await rt.dispatch("walker", "c1", later), timeout=60)
        monkeypatch.undo()
        records = await rt.history("walker", "c1")
    assert reply.text == "Arrived after 120 steps."
    kept_then = first[-1].offset - last.first_kept_offset + 1
    assert 0 < sum(reads) <= kept_then + 1 < len(first) // 4
    # Its first turn still shows the first submission's input, after that loop's summary.
    assert user_texts(model.requests[0]) == [TASK, later]
    # Its own compactions fold that input into the summary and keep only its own.
    (_, mine) = of(records, UserMessage)
    ours = [c for c in of(records, Compaction) if c.offset > mine.offset]
    # The first cuts at its input (the old loop is summarised whole), the next inside its loop.
    assert [c.kept_offsets for c in ours] == [None] + [[mine.offset]] * (len(ours) - 1)
    assert ours[0].first_kept_offset == mine.offset and len(ours) >= 2
    after = [r for r in turn_requests(model) if r.summary and "walked" in r.summary][-1]
    assert user_texts(after) == [later]


def _evidence(records: list[Record], over_budget: bool) -> Evidence:
    return Evidence(
        records=records,
        input_appended=True,
        attempt=2,
        max_attempts=5,
        deadline_passed=False,
        abort_requested=False,
        over_budget=over_budget,
    )


def test_a_turn_cut_after_a_compaction_made_progress_and_may_compact_again() -> None:
    # Compacted, then the retried turn streamed text and the process died: the turn fit, so a
    # restart that finds the context too long again compacts instead of giving up.
    records = _loop(2)
    end = records[-1].offset
    cut = AssistantMessageCompleted(id="m9:d", message_id="m9", stop_reason="aborted", text="Wa")
    records += [
        Compaction(id="k", summary="s", first_kept_offset=end + 1).with_offset(end + 1),
        AssistantMessageStarted(id="m9:s", message_id="m9", model="x/y").with_offset(end + 2),
        AssistantTextDelta(id="m9:t", message_id="m9", seq=0, delta="Wa").with_offset(end + 3),
        cut.with_offset(end + 4),
    ]
    assert classify_recovery(_evidence(records, False)).action is Action.CONTINUE_PARTIAL
    assert classify_recovery(_evidence(records, True)).action is Action.COMPACT
    # A turn that failed before any output made no progress: the retry was the one allowed.
    failed = AssistantMessageCompleted(
        id="m9:d", message_id="m9", stop_reason="error", error={"kind": "transient"}
    )
    records[-2:] = [failed.with_offset(end + 3)]
    d = classify_recovery(_evidence(records, True))
    assert d.action is Action.SETTLE_FAILED and d.error is not None
    assert d.error["type"] == "context_overflow"


def test_a_joined_message_is_progress() -> None:
    records = _loop(2)
    end = records[-1].offset
    records += [
        Compaction(id="k", summary="s", first_kept_offset=end + 1).with_offset(end + 1),
        UserMessage(id="j:input", message_id="j", content="and more").with_offset(end + 2),
    ]
    assert classify_recovery(_evidence(records, True)).action is Action.COMPACT


async def test_a_transient_error_is_not_quoted_as_the_provider_refusing_a_long_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream cut after long output whose retry hearth's estimate found too long: the
    failure quoted the cut ("connection reset") as the provider's refusal."""
    monkeypatch.setattr("hearth.runtime.recovery.BACKOFF_BASE_S", 0.01)
    turns = 0

    def script(request: ModelRequest) -> Step:
        nonlocal turns
        if request.purpose != "turn":
            return reply("summary")
        turns += 1
        if turns == 1:
            return error("transient", "connection reset", after_chunks=["word " * 3000])
        return reply("ok")

    model = ScriptedModel("a", script, context_window=1000)
    agent = hearth.Agent(lambda ctx: (ctx.use_model("scripted/a"), "system")[1], name="a")
    async with hearth.App([agent], db="memory", providers=[model]).run() as rt:
        receipt = await rt.dispatch("a", "c", "tell me " + "x " * 1490)
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(receipt, timeout=20)
    assert failed.value.type == "context_overflow"
    assert "connection reset" not in failed.value.error["message"]
