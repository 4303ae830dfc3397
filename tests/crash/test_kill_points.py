"""Kill points: every store write is bracketed by its points, every listed point is reached, and
real processes killed at the new points recover as the contract says (SPEC §3, §6)."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import killpoints
import pytest
from crashlab import Lab

import hearth
import hearth.app
from hearth import _faults
from hearth.records import (
    AssistantMessageCompleted,
    AssistantToolCall,
    Record,
    SubmissionSettled,
    ToolOutcome,
)
from hearth.runtime.owner import _boot_id, _pid_namespace, this_host
from hearth.store import open_store
from hearth.store.base import NewSubmission, Store
from hearth.testing import KILL_POINTS, STORE_WRITES
from hearth.testing.points import EFFECT_WRITES, INPUT_WRITES

# Store methods that only read (or open and close): everything else must be in STORE_WRITES.
STORE_READS = {
    "open",
    "close",
    "ping",
    "now",
    "read",
    "read_page",
    "last_of_type",
    "get_conversation",
    "get_state",
    "get_submission",
    "get_submissions",
    "turn_view",
    "list_conversations",
    "list_submissions",
    "count_submissions",
    "latest_settled",
    "lease_owners",
    "get_delivery",
    "list_deliveries",
    "list_schedules",
    "get_wait",
    "list_waits",
    "next_wait_expiry",
    "get_attachment",
}
# Called only inside the store (``settle_batch`` by ``Store.settle``, ``join`` by
# ``Store.join_many``); a runtime call of its own would be unguarded.
STORE_INTERNAL = {"settle_batch", "join"}
# Writes made for an operator, outside any attempt: bracketed by their points in Runtime.resolve
# and Runtime.fork; ``hearth gc`` deletes only what nothing references, in one transaction.
STORE_OPERATOR = {"resolve_wait", "fork", "collect_attachments"}

Who = tuple[int, int | None]  # (thread, asyncio task): whose event it is


def _who() -> Who:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), id(task) if task is not None else None


@dataclass
class Trace:
    """Kill points reached and store writes called, in order, each with whose it is."""

    events: list[tuple[str, str, Who]] = field(default_factory=list)

    def point(self, name: str) -> None:
        self.events.append(("point", name, _who()))

    def reached(self) -> set[str]:
        return {name for kind, name, _ in self.events if kind == "point"}

    def calls(self) -> set[str]:
        return {name for kind, name, _ in self.events if kind == "call"}


class RecordingStore:
    """Wraps a store, noting each write call, its return and its failure in the trace."""

    def __init__(self, store: Store, trace: Trace) -> None:
        self._store = store
        self._trace = trace

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in STORE_WRITES and name not in STORE_INTERNAL | STORE_OPERATOR:
            return attr
        trace = self._trace

        async def write(*args: Any, **kwargs: Any) -> Any:
            trace.events.append(("call", name, _who()))
            try:
                result = await attr(*args, **kwargs)
            except BaseException:
                trace.events.append(("raise", name, _who()))
                raise
            trace.events.append(("return", name, _who()))
            return result

        return write


# No such pid: a dead local owner.
DEAD_OWNER = f"{this_host()}:{_boot_id()}:{_pid_namespace()}:999999999:x"


async def _leave_a_claim_of_a_dead_owner(db: str) -> None:
    store = open_store(db)
    await store.open()
    try:
        await store.admit(NewSubmission("lab/z", "lab", "message", {"message": "plain"}))
        (claimed,) = await store.claim(DEAD_OWNER, 60.0, 1)
        assert claimed.conversation_id == "lab/z"
    finally:
        await store.close()


def _app(db: str) -> hearth.App:
    return hearth.App(
        [killpoints.lab, killpoints.helper],
        db=db,
        providers=killpoints.scenario_models(),
        lease_s=2.0,
        heartbeat_s=0.05,
        scan_s=0.2,
        shutdown_s=2.0,
    )


async def _until(condition: Any, timeout: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < end, "condition not met in time"
        await asyncio.sleep(0.02)


async def _tool_started(rt: Any, conversation: str) -> bool:
    history = await rt.history("lab", conversation)
    return any(isinstance(r, AssistantToolCall) for r in history)


async def _waiting(rt: Any, submission_id: str) -> bool:
    return bool((await rt.submission(submission_id)).status == "waiting")


async def _scenario(db: str) -> None:
    """Every store write and every runner seam, in two runs of one app on one file."""
    await _leave_a_claim_of_a_dead_owner(db)  # the first run expires it, then runs it
    async with _app(db).run() as rt:
        tools = await rt.dispatch("lab", "a", "tools")  # hooks, state, steps, heartbeats
        await _until(lambda: _tool_started(rt, "a"))
        joiner = await rt.dispatch("lab", "a", "joiner")  # joins at the turn boundary
        await rt.dispatch("lab", "c", "hello")
        compacted = await rt.dispatch("lab", "c", "compact me")
        delegated = await rt.dispatch("lab", "b", "delegate")
        signalled = await rt.dispatch("lab", "s", signal={"type": "ping", "body": "hi"})
        hanging = await rt.dispatch("lab", "d", "hang")
        left = await rt.dispatch("lab", "e", "delegate and hang")  # shut down mid-child
        approved = await rt.dispatch("lab", "w", "approve")  # waits, resolved from outside
        expiring = await rt.dispatch("lab", "x", "approve soon")  # waits, then times out
        await _until(lambda: _waiting(rt, approved.submission_id))
        [wait] = await rt.waits("lab/w")
        await rt.resolve("lab", "w", wait.wait_id, True)
        await rt.collect_attachments()  # an operator's hearth gc, while work runs
        await _until(lambda: _tool_started(rt, "d"))
        await rt.abort("lab", "d")
        for receipt in (
            tools,
            joiner,
            compacted,
            delegated,
            signalled,
            hanging,
            approved,
            expiring,
        ):
            await rt.wait_settled(receipt.submission_id, timeout=20)
        info = await rt.conversation_info("lab/c")  # at rest: its last record is a settlement
        assert info is not None
        await rt.fork("lab", "c", info.last_offset, "c-fork")
        sub = await rt.submission(left.submission_id)
        assert sub.outcome is None
    async with _app(db).run() as rt:  # resumes the child the shutdown left
        await rt.settle_all(timeout=20)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trace]:
    """Runs the scenario once with the kill points recording instead of killing."""
    trace = Trace()
    db = str(tmp_path_factory.mktemp("killpoints") / "hearth.db")
    real_reached, real_open = _faults.reached, hearth.app.open_database

    async def recording_open(*args: Any, **kwargs: Any) -> Any:
        return RecordingStore(await real_open(*args, **kwargs), trace)

    _faults.reached = trace.point
    hearth.app.open_database = recording_open  # type: ignore[assignment]
    try:
        asyncio.run(_scenario(db))
    finally:
        _faults.reached, hearth.app.open_database = real_reached, real_open
    yield trace


def test_every_store_method_is_known_as_a_read_or_a_write() -> None:
    methods = {
        name
        for name, member in inspect.getmembers(Store)
        if inspect.iscoroutinefunction(member) and not name.startswith("_")
    }
    assert methods == (
        STORE_READS
        | set(STORE_WRITES)
        | set(INPUT_WRITES)
        | set(EFFECT_WRITES)
        | STORE_INTERNAL
        | STORE_OPERATOR
    )


def test_the_scenario_calls_every_store_write(scenario: Trace) -> None:
    assert scenario.calls() == set(STORE_WRITES) | STORE_OPERATOR


def test_every_store_write_is_bracketed_by_its_kill_points(scenario: Trace) -> None:
    events = scenario.events
    unguarded = []
    for i, (kind, name, who) in enumerate(events):
        if kind == "call":
            before = next(e for e in reversed(events[:i]) if e[2] == who)
            if before[:2] != ("point", f"before:store.{name}"):
                unguarded.append(f"{name}: preceded by {before[1]}")
        elif kind == "return":
            after = next((e for e in events[i + 1 :] if e[2] == who), None)
            if after is None or after[:2] != ("point", f"after:store.{name}"):
                unguarded.append(f"{name}: followed by {after and after[1]}")
    assert unguarded == []


def test_every_listed_kill_point_is_reached(scenario: Trace) -> None:
    assert sorted(set(KILL_POINTS) - scenario.reached()) == []


def test_the_listed_names_are_at_least_fifty_points_in_one_scheme() -> None:
    assert len(KILL_POINTS) >= 50
    families = {"before", "after", "model", "batch", "child", "delta", "compaction", "store"}
    assert {p.split(":")[0] for p in KILL_POINTS} - {"render"} <= families | {
        "tool-done",
        "hook",
        "hook-done",
    }


# --- real processes killed at the new points --------------------------------------------------


def of(records: list[Record], kind: type[Record]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


@pytest.mark.crash
def test_killed_after_an_ordinary_tool_ran_marks_it_interrupted_and_never_reruns_it(
    lab: Lab,
) -> None:
    first = lab.harness.run(dispatch=[("toolie", "c1", "charge me")], crash_at="tool-done:charge")
    assert first.killed
    assert lab.count("charge") == 1  # the body ran; its outcome was not recorded
    assert of(lab.harness.history("toolie/c1"), ToolOutcome) == []
    assert lab.harness.run().ok
    assert lab.count("charge") == 1
    records = lab.harness.history("toolie/c1")
    (outcome,) = of(records, ToolOutcome)
    assert outcome.is_error and outcome.content["type"] == "interrupted"
    (done,) = of(records, SubmissionSettled)
    assert done.outcome == "completed" and done.reply == "saw charge=interrupted"


@pytest.mark.crash
def test_killed_before_the_commit_of_a_large_batch_leaves_none_of_it(
    make_lab: Any,
) -> None:
    lab = make_lab("killpoints:app")
    first = lab.harness.run(
        dispatch=[("fanout", "f1", "look everything up")],
        crash_at="before:assistant_message_completed>store:commit-begin",
    )
    assert first.killed
    records = lab.harness.history("fanout/f1")
    assert of(records, AssistantToolCall) == [] and of(records, AssistantMessageCompleted) == []
    assert lab.harness.run().ok
    records = lab.harness.history("fanout/f1")
    completed = [c for c in of(records, AssistantMessageCompleted) if c.stop_reason == "tool_use"]
    (batch,) = completed
    calls = [c for c in of(records, AssistantToolCall) if c.message_id == batch.message_id]
    assert len(calls) == killpoints.FANOUT == len(of(records, AssistantToolCall))
    assert sorted(lab.ran()) == sorted(f"lookup-{n}" for n in range(killpoints.FANOUT))
    (done,) = of(records, SubmissionSettled)
    assert done.outcome == "completed" and done.reply == f"looked up {killpoints.FANOUT}"


@pytest.mark.crash
@pytest.mark.parametrize(
    ("point", "claimed"), [("before:store.claim", 0), ("after:store.claim", 1)]
)
def test_killed_around_a_claim_the_submission_still_settles_exactly_once(
    lab: Lab, point: str, claimed: int
) -> None:
    admitted = lab.harness.run(dispatch=[("finisher", "c1", "hi")], crash_at="after:store.admit")
    assert admitted.killed
    (before,) = lab.harness.submissions("finisher/c1")
    # The next process's first claim is the one that takes the submission: kill around it.
    assert lab.harness.run(crash_at=point).killed
    (at_kill,) = lab.harness.submissions("finisher/c1")
    assert at_kill.attempt == before.attempt + claimed
    assert lab.harness.run().ok
    (sub,) = lab.harness.submissions("finisher/c1")
    assert sub.outcome == "completed" and sub.reply == "done once"
    assert sub.attempt == at_kill.attempt + 1
    (done,) = of(lab.harness.history("finisher/c1"), SubmissionSettled)
    assert done.submission_id == sub.id


def test_a_chained_point_kills_at_its_last_stage_only_after_the_earlier_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kills: list[int] = []
    monkeypatch.setattr(_faults.os, "kill", lambda pid, sig: kills.append(sig))
    _faults.configure("a>b#2")
    try:
        for point in ["b", "b", "a", "b", "c"]:
            _faults.reached(point)
        assert kills == []
        _faults.reached("b")
        assert len(kills) == 1
    finally:
        _faults.configure(None)


@pytest.mark.parametrize("spec", ["tool:echo#abc", "before:store.admit#0", "a>b#-1", "a#"])
def test_a_malformed_crash_point_is_one_line_not_a_traceback_on_import(spec: str) -> None:
    """``HEARTH_CRASH_AT='tool:x#abc'`` made every ``hearth`` command, and ``import hearth``,
    end in a traceback; ``#0`` was taken and never fired."""
    env = {**os.environ, "HEARTH_CRASH_AT": spec}
    done = subprocess.run(
        [sys.executable, "-c", "import hearth"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"hearth: HEARTH_CRASH_AT={spec!r}: #{spec.rpartition('#')[2]} must be a whole number"
        " from 1"
    ]


def test_every_point_the_code_reaches_is_a_crash_at_the_harness_takes() -> None:
    """A point no code reaches ran the child to its end, no kill, and the test passed: the
    harness now refuses it, so every point that exists must pass its check."""
    from hearth.testing.points import check_crash_at

    reached = re.findall(
        r'_faults\.reached\("([^"]+)"\)',
        "\n".join(p.read_text() for p in Path(hearth.__file__).parent.rglob("*.py")),
    )
    assert len(set(reached)) > 20
    for name in sorted(set(reached)):
        assert check_crash_at(name) == name
    for typo in ("bogus", "tool:", "tool:refund#0", "tool:refund#x", "after:store.nothing"):
        with pytest.raises(ValueError, match="crash_at"):
            check_crash_at(typo)
    assert check_crash_at("before:store.admit>store:commit-done#2")
