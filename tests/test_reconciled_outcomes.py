"""Reconciled outcomes in process: declaring ``reconcile``, the classifier's plan, the record
form, and the invariant checker's rule (proven by planting each fault it must catch)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import hearth
from hearth.records import (
    AssistantToolCall,
    Signal,
    ToolOutcome,
    ToolStepSettled,
    record_from_json,
)
from hearth.runtime.outcomes import reconciled_done
from hearth.runtime.recovery import RERUN_STEP, CallPlan, MessageView, plan_tool_batch
from hearth.store import open_store
from hearth.testing import Ledger, ScriptedModel, call, calls, reply
from hearth.testing import invariants as inv
from hearth.testing.invariants import ToolLog, ToolRun, check_invariants

CONV = "shop/c1"


def test_reconcile_on_a_durable_tool_is_refused_at_declaration() -> None:
    async def fn(ctx: hearth.ToolContext) -> str:
        return "x"

    with pytest.raises(hearth.ConfigurationError, match="reconcile"):
        hearth.tool(durable=True, reconcile=lambda call: None)(fn)


def test_a_reconcile_timeout_must_be_positive() -> None:
    with pytest.raises(hearth.ConfigurationError, match="reconcile_timeout"):
        hearth.tool(name="t", reconcile=lambda call: None, reconcile_timeout=0)(lambda: 1)


def test_an_outcome_without_reconciled_keeps_its_json_form() -> None:
    plain = ToolOutcome(
        id="o", message_id="m", tool_call_id="t", name="n", is_error=False, content=1
    )
    assert "reconciled" not in plain.to_json()
    done = ToolOutcome(
        id="o",
        message_id="m",
        tool_call_id="t",
        name="n",
        is_error=False,
        content=1,
        reconciled="done",
    )
    assert done.to_json()["reconciled"] == "done"
    assert record_from_json(done.to_json()) == done


def _call(call_id: str, name: str, attempt: int = 1) -> AssistantToolCall:
    return AssistantToolCall(
        id=f"m:call:{call_id}",
        message_id="m",
        tool_call_id=call_id,
        name=name,
        arguments={},
        attempt=attempt,
    )


def test_the_plan_reconciles_only_a_reconcilable_call_of_a_dead_attempt_never_re_run() -> None:
    view = MessageView("m", 1, calls=[_call("a", "pay"), _call("b", "look"), _call("c", "pay")])
    view.reruns.add("c")
    plan = plan_tool_batch(view, 2, {"pay": False, "look": False}, [], ["pay"])
    assert plan == {"a": CallPlan.RECONCILE, "b": CallPlan.INTERRUPTED, "c": CallPlan.INTERRUPTED}
    assert plan_tool_batch(view, 1, {"pay": False}, [], ["pay"])["a"] is CallPlan.RUN


def test_a_done_error_that_cannot_be_printed_is_still_the_calls_outcome() -> None:
    """Its message was made with ``str()``, which raised in every attempt: recovery looped,
    asking the external system again each time, and the submission never settled."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    class Odd:
        def __str__(self) -> str:
            raise RuntimeError("no")

    call = _call("c1", "pay")
    raised = reconciled_done("m1", call, hearth.Done(error=Unprintable()))
    assert raised.content == {
        "type": "exception",
        "message": "Unprintable: <its message cannot be printed>",
    }
    given = reconciled_done("m1", call, hearth.Done(error=Odd()))  # type: ignore[arg-type]
    assert given.content == {"type": "error", "message": "<its message cannot be printed>"}
    assert raised.is_error and given.is_error and raised.reconciled == "done"


def test_the_ledger_takes_one_effect_per_key(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    assert ledger.record("k", 1) and not ledger.record("k", 2)
    assert ledger.get("k") == 1 and ledger.entries() == {"k": 1}
    assert ledger.tombstone("other") and not ledger.record("other", 3)
    assert not ledger.tombstone("k")
    assert [took for _, took, _ in ledger.requests("k")] == [True, False, False]


# --- the invariant checker learns the new outcomes ------------------------------------------


@hearth.tool(reconcile=lambda call: hearth.NotDone())
async def bump() -> str:
    """Count."""
    return "bumped"


@hearth.agent
def shop(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/shop")
    ctx.use_tool(bump)
    return "You shop."


@pytest.fixture
def db(tmp_path: Path) -> Path:
    import asyncio

    path = tmp_path / "h.db"
    model = ScriptedModel("shop", [calls(call("bump")), reply("done")])
    app = hearth.App([shop], db=str(path), providers=[model])

    async def main() -> None:
        async with app.run() as rt:
            await rt.dispatch("shop", "c1", "go")
            await rt.settle_all(timeout=10)

    asyncio.run(main())
    return path


def _records(db: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            'SELECT body FROM records WHERE conversation_id = ? ORDER BY "offset"', (CONV,)
        ).fetchall()
    finally:
        conn.close()
    return [json.loads(body) for (body,) in rows]


def _replace(db: Path, record: Any) -> None:
    body, digest = record.encode(record.offset)
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute(
                'INSERT OR REPLACE INTO records (conversation_id, "offset", id, type,'
                " submission_id, body, digest) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (CONV, record.offset, record.id, record.type, record.submission_id, body, digest),
            )
    finally:
        conn.close()


def _rules(db: Path, log: ToolLog | None = None) -> set[str]:
    import asyncio

    async def main() -> set[str]:
        store = open_store(str(db))
        await store.open()
        try:
            return {v.rule for v in await check_invariants(store, tool_log=log)}
        finally:
            await store.close()

    return asyncio.run(main())


def _outcome(db: Path) -> ToolOutcome:
    found = record_from_json(next(r for r in _records(db) if r["type"] == "tool_outcome"))
    assert isinstance(found, ToolOutcome)
    return found


def _with(db: Path, **changes: Any) -> None:
    import dataclasses

    _replace(db, dataclasses.replace(_outcome(db), **changes))


def _plant_rerun_before_outcome(db: Path) -> None:
    """Turn the record before the outcome (the call, re-stamped) into nothing: instead, move
    the outcome one on and put a re-run record in its place."""
    import dataclasses

    got = _outcome(db)
    rerun = ToolStepSettled(
        id=f"{got.message_id}:rerun:{got.tool_call_id}",
        tool_call_id=got.tool_call_id,
        step=RERUN_STEP,
        value={},
        offset=got.offset,
        submission_id=got.submission_id,
        attempt=got.attempt,
    )
    after = [r for r in _records(db) if r["offset"] > got.offset]
    # shift everything after the outcome by one, then write the rerun and the outcome
    for r in reversed(after):
        moved = record_from_json({**r, "offset": r["offset"] + 1})
        _replace(db, moved)
    _replace(db, dataclasses.replace(got, offset=got.offset + 1))
    _replace(db, rerun)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "UPDATE conversations SET last_offset = last_offset + 1 WHERE conversation_id = ?",
            (CONV,),
        )
    conn.close()


def test_a_clean_run_has_no_violation(db: Path) -> None:
    assert _rules(db) == set()


def test_an_unknown_reconciled_value_is_caught(db: Path) -> None:
    _with(db, reconciled="maybe")
    assert _rules(db) == {inv.RECONCILED}


def test_a_not_done_run_without_its_re_run_record_is_caught(db: Path) -> None:
    _with(db, reconciled="not_done")
    assert _rules(db) == {inv.RECONCILED}


def test_a_done_after_a_re_run_is_caught(db: Path) -> None:
    _plant_rerun_before_outcome(db)
    _with(db, reconciled="done")
    assert _rules(db) == {inv.RECONCILED}


def test_a_re_run_whose_outcome_forgets_it_is_caught(db: Path) -> None:
    _plant_rerun_before_outcome(db)
    assert _rules(db) == {inv.RECONCILED}


def test_a_re_run_allows_a_second_run_and_no_third(db: Path) -> None:
    call_id = _outcome(db).tool_call_id
    two = [ToolRun(CONV, call_id, run=0), ToolRun(CONV, call_id, run=1)]
    assert _rules(db, ToolLog(two)) == {inv.ORDINARY_RAN_TWICE}  # no re-run record
    _plant_rerun_before_outcome(db)
    _with(db, reconciled="not_done")
    assert _rules(db, ToolLog(two)) == set()
    three = [*two, ToolRun(CONV, call_id, run=2)]
    assert _rules(db, ToolLog(three)) == {inv.ORDINARY_RAN_TWICE}


# --- never while the call still runs on a thread of this process ------------------------------


def _abort_mid_call(
    tmp_path: Path, reconcile_timeout: float, work_s: float
) -> tuple[ToolOutcome, list[list[str]]]:
    """A sync tool (on a worker thread) is aborted mid-call; at rest its reconcile asks the
    ledger. Asked at once, the ledger would not have the effect yet (NotDone: wrong). Returns
    the call's outcome, and the calls named interrupted by the error and by the advisory."""
    import asyncio
    import time

    ledger = Ledger(tmp_path / "ledger")
    started = asyncio.Event()
    loop_box: list[asyncio.AbstractEventLoop] = []

    def paid(call: hearth.ReconcileCall) -> Any:
        entry = ledger.get(call.tool_call_id)
        return hearth.NotDone() if entry is None else hearth.Done(entry)

    @hearth.tool(reconcile=paid, reconcile_timeout=reconcile_timeout)
    def pay(ctx: hearth.ToolContext) -> dict[str, int]:
        """Pay slowly."""
        loop_box[0].call_soon_threadsafe(started.set)
        time.sleep(work_s)
        ledger.record(ctx.tool_call_id, {"paid": 5})
        return {"paid": 5}

    @hearth.agent
    def till(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/till")
        ctx.use_tool(pay)
        return "Pay."

    model = ScriptedModel("till", [calls(call("pay")), reply("done")])
    app = hearth.App([till], db=str(tmp_path / "h.db"), providers=[model])

    async def main() -> tuple[ToolOutcome, list[list[str]]]:
        loop_box.append(asyncio.get_running_loop())
        async with app.run() as rt:
            receipt = await rt.dispatch("till", "c1", "go")
            await started.wait()
            await rt.abort("till", "c1")
            with pytest.raises(hearth.SubmissionAborted) as aborted:
                await rt.read(receipt, timeout=30)
            records = await rt.history("till", "c1")
        (found,) = [r for r in records if isinstance(r, ToolOutcome)]
        (signal,) = [r for r in records if isinstance(r, Signal)]
        named = [
            [t["tool_call_id"] for t in aborted.value.interrupted_tools],
            [t["tool_call_id"] for t in signal.attributes["interrupted_tools"]],
        ]
        return found, named

    return asyncio.run(main())


def test_at_rest_reconcile_waits_for_the_calls_thread_before_asking(tmp_path: Path) -> None:
    got, named = _abort_mid_call(tmp_path, reconcile_timeout=20, work_s=1.0)
    assert (got.reconciled, got.is_error, got.content) == ("done", False, {"paid": 5})
    assert named == [[], []]  # its outcome is known: not reported as interrupted


def test_a_thread_still_running_past_the_reconcile_timeout_keeps_the_marker(
    tmp_path: Path,
) -> None:
    got, named = _abort_mid_call(tmp_path, reconcile_timeout=0.2, work_s=2.0)
    assert got.reconciled is None and got.content["type"] == "interrupted"
    assert named == [[got.tool_call_id], [got.tool_call_id]]
