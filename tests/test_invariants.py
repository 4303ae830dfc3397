"""The invariant checker catches each fault a broken run would leave, planted into a real SQLite
file; a clean run reports nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import hearth
from hearth.errors import FencedOut
from hearth.records import (
    ChildConversationLinked,
    HookSeamCommitted,
    Record,
    Signal,
    StateWrite,
    SubmissionSettled,
    UserMessage,
    record_from_json,
)
from hearth.runtime.recovery import BOOKKEEPING_STEPS
from hearth.store import open_store
from hearth.store.base import NewSubmission
from hearth.store.rules import settlement
from hearth.testing import ScriptedModel, call, calls, reply
from hearth.testing import invariants as inv
from hearth.testing.invariants import ToolLog, ToolRun, check_invariants

pytestmark = pytest.mark.anyio
CONV = "shop/c1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@hearth.tool(durable=True)
async def provision(ctx: hearth.ToolContext) -> int:
    """Two steps."""
    return await ctx.step.do("one", lambda: 1) + await ctx.step.do("two", lambda: 2)


@hearth.agent
def shop(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/shop")
    ctx.use_tool(provision)
    count, set_count = ctx.use_state("count", 0)

    @hearth.tool
    async def bump() -> str:
        """Count."""
        set_count(count + 1)
        return "bumped"

    ctx.use_tool(bump)
    return "You shop."


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    """A clean run: one submission, a tool batch with a state write and a durable step, a reply."""
    path = tmp_path / "h.db"
    model = ScriptedModel("shop", [calls(call("bump"), call("provision")), reply("done")])
    app = hearth.App([shop], db=str(path), providers=[model])
    async with app.run() as rt:
        await rt.dispatch("shop", "c1", "go")
        await rt.settle_all(timeout=10)
    return path


async def violations(db: Path, tool_log: ToolLog | None = None) -> list[inv.Violation]:
    store = open_store(str(db))
    await store.open()
    try:
        return await check_invariants(store, tool_log=tool_log)
    finally:
        await store.close()


async def rules(db: Path, tool_log: ToolLog | None = None) -> set[str]:
    return {v.rule for v in await violations(db, tool_log)}


# --- planting faults with plain SQL, behind the store's back ----------------------------------


@contextmanager
def sql(db: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection, committed and closed (the store may only open a file nobody holds)."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def records(db: Path) -> list[dict[str, Any]]:
    with sql(db) as conn:
        rows = conn.execute(
            'SELECT body FROM records WHERE conversation_id = ? ORDER BY "offset"', (CONV,)
        )
        return [json.loads(body) for (body,) in rows]


def first(db: Path, kind: str) -> dict[str, Any]:
    return next(r for r in records(db) if r["type"] == kind)


def plant(db: Path, record: Record, *, offset: int | None = None) -> None:
    """Write ``record`` at ``offset`` (default: the end), replacing what is there."""
    at = len(records(db)) if offset is None else offset
    body, digest = record.encode(at)
    with sql(db) as conn:
        conn.execute(
            'INSERT OR REPLACE INTO records (conversation_id, "offset", id, type, submission_id,'
            " body, digest) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (CONV, at, record.id, record.type, record.submission_id, body, digest),
        )
        conn.execute(
            "UPDATE conversations SET last_offset = MAX(last_offset, ?) WHERE conversation_id = ?",
            (at, CONV),
        )


def submission_id(db: Path) -> str:
    return str(first(db, "submission_settled")["submission_id"])


# --- the tests --------------------------------------------------------------------------------


async def test_a_clean_run_has_no_violation(db: Path) -> None:
    assert await violations(db) == []


async def test_a_second_settlement_record_under_another_id_is_caught(db: Path) -> None:
    sid = submission_id(db)
    plant(db, SubmissionSettled(id=f"{sid}:again", submission_id=sid, attempt=1, outcome="failed"))
    assert await rules(db) == {inv.SETTLED_ONCE}


async def test_a_row_whose_outcome_disagrees_with_its_record_is_caught(db: Path) -> None:
    with sql(db) as conn:
        conn.execute("UPDATE submissions SET outcome = 'failed', error = '{\"type\": \"WRONG\"}'")
    assert await rules(db) == {inv.ROW_MATCHES_RECORD}


async def test_a_record_of_attempt_1_after_attempt_2_began_is_caught(db: Path) -> None:
    outcome = first(db, "tool_outcome")  # attempt 2 wrote this; attempt 1 went on writing
    plant(db, record_from_json({**outcome, "attempt": 2}), offset=outcome["offset"])
    found = await violations(db)
    assert {v.rule for v in found} == {inv.STALE_ATTEMPT}
    assert all("after attempt 2 began" in v.detail for v in found)


async def test_a_record_after_the_settlement_is_caught(db: Path) -> None:
    sid = submission_id(db)
    plant(db, Signal(id="late", submission_id=sid, attempt=1, signal_type="zombie"))
    assert await rules(db) == {inv.AFTER_SETTLEMENT}


async def test_an_offset_gap_is_caught(db: Path) -> None:
    plant(db, Signal(id="gap", signal_type="note"), offset=len(records(db)) + 1)
    assert await rules(db) == {inv.DENSE_OFFSETS}


async def test_an_assistant_message_never_completed_is_caught(db: Path) -> None:
    last = [r for r in records(db) if r["type"] == "assistant_message_completed"][-1]
    envelope = {k: last[k] for k in ("offset", "id", "submission_id", "attempt")}
    plant(db, Signal(**envelope, signal_type="note"), offset=last["offset"])
    assert await rules(db) == {inv.MESSAGE_CLOSED}


async def test_a_state_write_outside_a_batch_is_caught(db: Path) -> None:
    plant(db, StateWrite(id="stray", name="count", value=7))
    assert await rules(db) == {inv.STATE_IN_BATCH}


async def test_a_finish_seam_state_write_with_its_continuation_is_inside_the_seam(
    db: Path,
) -> None:
    note = Signal(id="seam:continue:0", signal_type="continuation", body="more")
    plant(db, StateWrite(id="seam:state", name="count", value=2))
    plant(db, note)
    assert await rules(db) == {inv.STATE_IN_BATCH}  # no commit yet
    plant(db, HookSeamCommitted(id="seam", hook="on_agent_finish", message_id="m"))
    assert await rules(db) == set()


async def test_a_linked_child_that_never_began_is_not_a_broken_stream(db: Path) -> None:
    link = ChildConversationLinked(id="link", tool_call_id="t", child_conversation_id="shop/kid")
    plant(db, link)
    assert await rules(db) == set()


async def test_a_step_recorded_twice_is_caught(db: Path) -> None:
    # (the provision tool's two steps; bump's state writes are recorded with its outcome as a
    # step of hearth's own)
    one, two = [
        r
        for r in records(db)
        if r["type"] == "tool_step_settled" and r["step"] not in BOOKKEEPING_STEPS
    ]
    plant(db, record_from_json({**one, "id": one["id"] + ":again"}), offset=two["offset"])
    assert await rules(db) == {inv.STEP_ONCE}


async def test_a_second_tool_outcome_for_one_call_is_caught(db: Path) -> None:
    bump, other = [r for r in records(db) if r["type"] == "tool_outcome"]
    plant(db, record_from_json({**bump, "id": bump["id"] + ":again"}), offset=other["offset"])
    assert await rules(db) == {inv.TOOL_OUTCOME_ONCE}


async def test_a_settled_submission_with_a_batch_left_open_is_caught(db: Path) -> None:
    commit = first(db, "tool_results_committed")
    envelope = {k: commit[k] for k in ("offset", "id", "submission_id", "attempt")}
    plant(db, Signal(**envelope, signal_type="note"), offset=commit["offset"])
    # the batch's state write has lost its commit too
    assert await rules(db) == {inv.BATCH_CLOSED, inv.STATE_IN_BATCH}


async def test_a_zombie_attempt_leaves_nothing_for_the_checker_to_find(tmp_path: Path) -> None:
    """Attempt 1 lost its claim but lives on: its writes are fenced out, so the stream shows no
    stale attempt (without the store's fencing, the checker reports one)."""
    store = open_store(str(tmp_path / "z.db"))
    await store.open()
    try:
        await store.admit(NewSubmission(CONV, "shop", "message", {"text": "hi"}))
        (first,) = await store.claim("owner-1", 30, 1)
        sid = first.id
        user = UserMessage(id=f"{sid}:input", message_id=sid, content="hi")
        await store.append(CONV, [user.stamped(sid, 1)], fence=first.fence)
        await store.expire_owners(["owner-1"])
        (second,) = await store.claim("owner-2", 30, 1)
        resumed = Signal(id="resumed", signal_type="note").stamped(sid, 2)
        await store.append(CONV, [resumed], fence=second.fence)
        done = settlement(sid, "completed", None, "ok").stamped(sid, 2)
        await store.settle(second.fence, done, outcome="completed", error=None, reply="ok")
        with contextlib.suppress(FencedOut):  # the zombie goes on writing, and is refused
            zombie = Signal(id="zombie", signal_type="note").stamped(sid, 1)
            await store.append(CONV, [zombie], fence=first.fence)
        assert await check_invariants(store) == []
    finally:
        await store.close()


# --- the tools' own log -----------------------------------------------------------------------


def bump_call(db: Path) -> str:
    return str(
        next(r for r in records(db) if r["type"] == "tool_outcome" and r["name"] == "bump")[
            "tool_call_id"
        ]
    )


async def test_an_ordinary_call_that_ran_twice_is_caught(db: Path) -> None:
    call_id = bump_call(db)
    log = ToolLog([ToolRun(CONV, call_id, run=0), ToolRun(CONV, call_id, run=1)])
    assert await rules(db, log) == {inv.ORDINARY_RAN_TWICE}


async def test_a_call_that_ran_after_its_outcome_was_stored_is_caught(db: Path) -> None:
    call_id = first(db, "tool_step_settled")["tool_call_id"]
    runs = [ToolRun(CONV, call_id, run=0, durable=True), ToolRun(CONV, call_id, 1, durable=True)]
    assert await rules(db, ToolLog(runs, {(CONV, call_id, None): 1})) == set()
    assert await rules(db, ToolLog(runs, {(CONV, call_id, None): 0})) == {inv.RECORDED_RAN_AGAIN}


async def test_a_step_that_ran_after_its_record_was_stored_is_caught(db: Path) -> None:
    call_id = first(db, "tool_step_settled")["tool_call_id"]
    runs = [ToolRun(CONV, call_id, run, step="one") for run in (0, 1)]
    # running again while its record was not yet on disk is the contract (at least once)
    assert await rules(db, ToolLog(runs, {(CONV, call_id, "one"): 1})) == set()
    assert await rules(db, ToolLog(runs, {(CONV, call_id, "one"): 0})) == {inv.STEP_RAN_AGAIN}


def test_violations_name_their_rule_and_conversation() -> None:
    found = inv.Violation(inv.DENSE_OFFSETS, CONV, "missing [3]")
    assert str(found) == "dense_offsets in shop/c1: missing [3]"
    assert "1 invariant violation" in str(inv.InvariantsBroken([found]))
    assert dataclasses.is_dataclass(found)
