"""One checker of what a store must look like after any crash: the accepted-work contract read
from the stored records and submission rows (and, optionally, from a log the tools kept).

It looks for what a broken run would leave behind — a second settlement, a row that disagrees with
its settlement record, a write of a stale attempt or after the settlement, a gap in the offsets, a
batch or message left open, a state write outside a committed batch, a step recorded twice, a
recorded or ordinary call that ran again — not for what deterministic ids would dedupe anyway.

Example (in a test)::

    harness.run_until_settled()
    await assert_invariants(store)          # or: harness.assert_invariants()
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hearth.effects import DONE, NOT_DONE
from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantToolCall,
    ChildConversationLinked,
    ConversationCreated,
    HookSeamCommitted,
    Record,
    Signal,
    StateWrite,
    SubmissionSettled,
    ToolOutcome,
    ToolResultsCommitted,
    ToolStepSettled,
    WaitResolved,
    WaitStarted,
)
from hearth.runtime.recovery import RERUN_STEP
from hearth.store.base import JOINED, SETTLED, WAITING, Store, Submission, all_submissions

# The rules a violation names.
SETTLED_ONCE = "settled_once"  # one submission_settled record per submission, in its conversation
ROW_MATCHES_RECORD = "row_matches_settlement"  # status/outcome/error/reply agree with the record
UNSETTLED = "unsettled"  # a submission is still queued or running when the store should be at rest
DENSE_OFFSETS = "dense_offsets"  # offsets 0..N without a gap
STARTS_CREATED = "starts_with_conversation_created"  # offset 0 is conversation_created
AFTER_SETTLEMENT = "record_after_settlement"  # a submission wrote after its settlement record
STALE_ATTEMPT = "stale_attempt"  # attempt k wrote after attempt k+1 began
TOOL_OUTCOME_ONCE = "tool_outcome_once"  # one outcome per call of a committed batch
BATCH_CLOSED = "batch_closed"  # a settled submission left a tool batch without its commit
STEP_ONCE = "step_recorded_once"  # one tool_step_settled per (call, step)
STATE_IN_BATCH = "state_write_in_batch"  # a state write commits with a batch or a hook seam
MESSAGE_CLOSED = "message_closed"  # a settled submission left an assistant message open
RECORDED_RAN_AGAIN = "recorded_call_ran_again"  # a call ran after its outcome was on disk
ORDINARY_RAN_TWICE = "ordinary_call_ran_twice"  # an ordinary (non-durable) call ran twice
STEP_RAN_AGAIN = "step_ran_again"  # a step's body ran after its record was on disk
WAIT_ENDED_ONCE = "wait_ended_once"  # one wait_resolved per wait, after its wait_started
WAITING_HAS_OPEN_WAIT = "waiting_has_open_wait"  # waiting ⇔ a wait of it is open; no lease
# A reconciled outcome says done/not_done; a call ran again (not_done) only after its one re-run
# record; a re-run call is never reconciled again, and gets its own or the interrupted outcome.
RECONCILED = "reconciled_outcome"

Key = tuple[str, str, str | None]  # (conversation, tool call id, step name or None for the call)


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which rule, where, and what was found."""

    rule: str
    conversation_id: str | None
    detail: str

    def __str__(self) -> str:
        where = f" in {self.conversation_id}" if self.conversation_id else ""
        return f"{self.rule}{where}: {self.detail}"


@dataclass(frozen=True)
class ToolRun:
    """One execution as the tool itself saw it: an ordinary call, a durable tool's body
    (``durable``), or a durable step's body (``step``); ``run`` numbers the process (0, 1, …)."""

    conversation_id: str
    tool_call_id: str
    run: int
    step: str | None = None
    durable: bool = False


@dataclass
class ToolLog:
    """What the tools logged, and after which process run each outcome (step ``None``) and each
    step record (by step name) was first seen on disk."""

    runs: list[ToolRun]
    on_disk_after: Mapping[Key, int] = field(default_factory=dict)


class InvariantsBroken(AssertionError):
    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in violations)
        super().__init__(f"{len(violations)} invariant violation(s):\n{lines}")


async def check_invariants(
    store: Store, *, tool_log: ToolLog | None = None, at_rest: bool = True
) -> list[Violation]:
    """Every violation found in ``store`` (empty when all is well). ``at_rest``: nothing may be
    queued or running any more."""
    subs = {s.id: s for s in await all_submissions(store)}
    streams = await read_streams(store, subs.values())
    abandoned = _abandoned_children(streams)
    children = {
        r.child_conversation_id
        for records in streams.values()
        for r in records
        if isinstance(r, ChildConversationLinked)
    }
    found: list[Violation] = []
    for conv, records in streams.items():
        if not records and conv in children:
            continue  # linked, then the parent stopped before the child began: nothing to judge
        found += _check_stream(conv, records, subs, at_rest=conv not in abandoned)
    found += _check_settlements(streams, subs, at_rest)
    found += _check_waits(streams, subs)
    if tool_log is not None:
        found += _check_tool_log(tool_log, _reruns(streams))
    return found


async def assert_invariants(
    store: Store, *, tool_log: ToolLog | None = None, at_rest: bool = True
) -> None:
    """``check_invariants``, raising ``InvariantsBroken`` (an ``AssertionError``) listing them."""
    found = await check_invariants(store, tool_log=tool_log, at_rest=at_rest)
    if found:
        raise InvariantsBroken(found)


async def read_streams(store: Store, subs: Iterable[Submission]) -> dict[str, list[Record]]:
    """The records of every conversation with a submission and, recursively, of their children."""
    streams: dict[str, list[Record]] = {}
    todo = sorted({s.conversation_id for s in subs})
    while todo:
        conv = todo.pop()
        if conv in streams:
            continue
        streams[conv] = records = await store.read(conv)
        todo += [r.child_conversation_id for r in records if isinstance(r, ChildConversationLinked)]
    return streams


async def recorded_keys(store: Store) -> set[Key]:
    """The calls with a recorded outcome and the recorded steps, as ``ToolLog`` keys."""
    streams = await read_streams(store, await all_submissions(store))
    keys: set[Key] = set()
    for conv, records in streams.items():
        for r in records:
            if isinstance(r, ToolOutcome):
                keys.add((conv, r.tool_call_id, None))
            elif isinstance(r, ToolStepSettled):
                keys.add((conv, r.tool_call_id, r.step))
    return keys


def _reruns(streams: Mapping[str, list[Record]]) -> set[tuple[str, str]]:
    """(conversation, call) of the ordinary calls recorded as run again after ``NotDone``."""
    return {
        (conv, r.tool_call_id)
        for conv, records in streams.items()
        for r in records
        if isinstance(r, ToolStepSettled) and r.step == RERUN_STEP
    }


def _check_reconciled(records: list[Record]) -> list[str]:
    """What is wrong with the reconciled outcomes and the re-run records of one stream."""
    problems: list[str] = []
    rerun_at: dict[str, int] = {}
    for r in records:
        if isinstance(r, ToolStepSettled) and r.step == RERUN_STEP:
            rerun_at.setdefault(r.tool_call_id, r.offset)
    for r in records:
        if not isinstance(r, ToolOutcome):
            continue
        rerun = rerun_at.get(r.tool_call_id)
        kind = r.content.get("type") if r.is_error and isinstance(r.content, dict) else None
        if r.reconciled is None:
            if rerun is not None and kind != "interrupted":
                problems.append(
                    f"call {r.tool_call_id} ran again (re-run at {rerun}) but its outcome at"
                    f" {r.offset} does not say reconciled: not_done"
                )
        elif r.reconciled not in (DONE, NOT_DONE):
            problems.append(f"outcome {r.id} at {r.offset} says reconciled: {r.reconciled!r}")
        elif r.reconciled == DONE and rerun is not None:
            problems.append(
                f"call {r.tool_call_id} was reconciled again (done at {r.offset}) after its"
                f" re-run at {rerun}"
            )
        elif r.reconciled == NOT_DONE and kind != "not_done":
            if rerun is None or rerun > r.offset:
                problems.append(
                    f"call {r.tool_call_id} has a not_done outcome at {r.offset} from a run"
                    " without its re-run record before it"
                )
    return problems


def _abandoned_children(streams: Mapping[str, list[Record]]) -> set[str]:
    """Children whose agent is no longer declared: their task got a ``subagent_missing`` outcome
    and their transcript stays as the crash left it (nothing can run it to rest)."""
    abandoned: set[str] = set()
    for records in streams.values():
        links = {
            r.tool_call_id: r.child_conversation_id
            for r in records
            if isinstance(r, ChildConversationLinked)
        }
        for r in records:
            if isinstance(r, ToolOutcome) and r.is_error and r.tool_call_id in links:
                if isinstance(r.content, dict) and r.content.get("type") == "subagent_missing":
                    abandoned.add(links[r.tool_call_id])
    return abandoned


def _unsettled(sid: str | None, subs: Mapping[str, Submission]) -> bool:
    sub = subs.get(sid or "")
    return sub is not None and sub.outcome is None


def _check_stream(
    conv: str, records: list[Record], subs: Mapping[str, Submission], *, at_rest: bool
) -> list[Violation]:
    """``at_rest``: once its submission settled, no batch or message of the stream is open."""
    found: list[Violation] = []

    def violation(rule: str, detail: str) -> None:
        found.append(Violation(rule, conv, detail))

    offsets = [r.offset for r in records]
    if offsets != list(range(len(records))):
        gaps = sorted(set(range(max(offsets, default=-1) + 1)) - set(offsets))
        violation(DENSE_OFFSETS, f"offsets are not 0..{len(records) - 1}; missing {gaps[:5]}")
    if not records or not isinstance(records[0], ConversationCreated) or records[0].offset != 0:
        violation(STARTS_CREATED, "the stream does not start with conversation_created at 0")

    settled_at: dict[str, int] = {}
    newest_attempt: dict[str, int] = {}
    for r in records:
        sid = r.submission_id
        if sid is None:
            continue
        if sid in settled_at and not isinstance(r, SubmissionSettled):  # that is SETTLED_ONCE
            violation(
                AFTER_SETTLEMENT,
                f"{r.type} {r.id} at {r.offset} after {sid} settled at {settled_at[sid]}",
            )
        if isinstance(r, SubmissionSettled):
            settled_at.setdefault(sid, r.offset)
        if r.attempt is not None:
            newest = newest_attempt.get(sid, r.attempt)
            if r.attempt < newest:
                violation(
                    STALE_ATTEMPT,
                    f"{r.type} {r.id} at {r.offset} from attempt {r.attempt} of {sid}"
                    f" after attempt {newest} began",
                )
            newest_attempt[sid] = max(newest, r.attempt)

    # Tool batches: one outcome per call once committed; closed unless the work still runs.
    calls: dict[str, list[AssistantToolCall]] = defaultdict(list)
    outcomes: Counter[str] = Counter()
    commits: dict[str, list[ToolResultsCommitted]] = defaultdict(list)
    outcome_at: dict[str, int] = {}
    for r in records:
        if isinstance(r, AssistantToolCall):
            calls[r.message_id].append(r)
        elif isinstance(r, ToolOutcome):
            outcomes[r.tool_call_id] += 1
            outcome_at.setdefault(r.tool_call_id, r.offset)
        elif isinstance(r, ToolResultsCommitted):
            commits[r.message_id].append(r)
    for call_id, n in outcomes.items():
        if n > 1:
            violation(TOOL_OUTCOME_ONCE, f"call {call_id} has {n} tool_outcome records")
    for message_id, made in calls.items():
        closing = commits.get(message_id, [])
        if not closing:
            if at_rest and not _unsettled(made[0].submission_id, subs):
                violation(BATCH_CLOSED, f"the tool batch of {message_id} was never committed")
            continue
        if len(closing) > 1:
            violation(BATCH_CLOSED, f"the tool batch of {message_id} was committed twice")
        commit = closing[0]
        for call in made:
            if outcomes[call.tool_call_id] == 0 or outcome_at[call.tool_call_id] > commit.offset:
                violation(
                    TOOL_OUTCOME_ONCE,
                    f"call {call.tool_call_id} of {message_id} has no outcome before its commit",
                )
        if sorted(commit.tool_call_ids) != sorted(c.tool_call_id for c in made):
            violation(BATCH_CLOSED, f"the commit of {message_id} names other calls than it made")

    for problem in _check_reconciled(records):
        violation(RECONCILED, problem)

    steps = Counter((r.tool_call_id, r.step) for r in records if isinstance(r, ToolStepSettled))
    for (call_id, step), n in steps.items():
        if n > 1:
            violation(STEP_ONCE, f"step {step!r} of call {call_id} was recorded {n} times")

    for i, r in enumerate(records):
        if isinstance(r, StateWrite):
            rest = (x for x in records[i + 1 :] if not _seam_part(x))
            closer = next(rest, None)
            if not isinstance(closer, ToolResultsCommitted | HookSeamCommitted):
                violation(STATE_IN_BATCH, f"state_write {r.id} at {r.offset} is outside a batch")

    started = {r.message_id: r for r in records if isinstance(r, AssistantMessageStarted)}
    completed = {r.message_id for r in records if isinstance(r, AssistantMessageCompleted)}
    for message_id, start in started.items():
        if message_id in completed or not at_rest:
            continue
        if not _unsettled(start.submission_id, subs):
            violation(MESSAGE_CLOSED, f"assistant message {message_id} was never completed")
    return found


def _seam_part(r: Record) -> bool:
    """A record that may sit between a state write and the record closing its unit: another
    state write, or an ``on_agent_finish`` continuation (both commit with the seam)."""
    return isinstance(r, StateWrite) or (isinstance(r, Signal) and r.signal_type == "continuation")


def _check_settlements(
    streams: Mapping[str, list[Record]], subs: Mapping[str, Submission], at_rest: bool
) -> list[Violation]:
    found: list[Violation] = []
    records: dict[str, list[tuple[str, SubmissionSettled]]] = defaultdict(list)
    for conv, stream in streams.items():
        for r in _own_records(stream):
            if isinstance(r, SubmissionSettled):
                records[r.submission_id or ""].append((conv, r))
    for sid, settled in records.items():
        if sid not in subs:
            conv = settled[0][0]
            found.append(Violation(SETTLED_ONCE, conv, f"{settled[0][1].id} settles no submission"))
    for sub in subs.values():
        conv = sub.conversation_id
        mine = records.get(sub.id, [])
        if len(mine) > 1:
            ids = ", ".join(f"{r.id} at {r.offset}" for _, r in mine)
            detail = f"{sub.id} settled {len(mine)} times: {ids}"
            found.append(Violation(SETTLED_ONCE, conv, detail))
        settled_row = sub.status == SETTLED or (sub.status == JOINED and sub.outcome is not None)
        if not mine:
            if settled_row:
                detail = f"{sub.id} is {sub.status} without a submission_settled record"
                found.append(Violation(SETTLED_ONCE, conv, detail))
            elif at_rest and sub.status != WAITING:  # a waiting submission is at rest
                found.append(Violation(UNSETTLED, conv, f"{sub.id} is still {sub.status}"))
            continue
        where, record = mine[0]
        if where != conv:
            detail = f"{sub.id}'s settlement record is in {where}"
            found.append(Violation(SETTLED_ONCE, conv, detail))
        row = (sub.outcome, sub.error, sub.reply)
        said = (record.outcome, record.error, record.reply)
        if not settled_row or row != said:
            detail = f"{sub.id} row is {sub.status} {row!r}, its record says {said!r}"
            found.append(Violation(ROW_MATCHES_RECORD, conv, detail))
    return found


def _own_records(stream: list[Record]) -> list[Record]:
    """The records a conversation wrote itself: a fork's copies of its source's records (up to
    the fork's offset) are the source's, and are judged there."""
    created = stream[0] if stream else None
    origin = created.forked_from if isinstance(created, ConversationCreated) else None
    if not origin:
        return stream
    return [r for r in stream if r.offset > int(origin["offset"])]


def _check_waits(
    streams: Mapping[str, list[Record]], subs: Mapping[str, Submission]
) -> list[Violation]:
    """Each wait ends once, after it started; a submission waits exactly while one of its waits
    is open, and then holds no lease."""
    found: list[Violation] = []
    open_waits: dict[str, list[str]] = defaultdict(list)  # submission → its open wait ids
    for conv, records in streams.items():
        started: dict[str, WaitStarted] = {}
        ended: Counter[str] = Counter()
        for r in records:
            if isinstance(r, WaitStarted):
                started.setdefault(r.wait_id, r)
            elif isinstance(r, WaitResolved):
                ended[r.wait_id] += 1
                if r.wait_id not in started:
                    detail = f"wait_resolved {r.id} at {r.offset} ends a wait that never started"
                    found.append(Violation(WAIT_ENDED_ONCE, conv, detail))
        for wait_id, n in ended.items():
            if n > 1:
                found.append(Violation(WAIT_ENDED_ONCE, conv, f"wait {wait_id} ended {n} times"))
        for wait_id, record in started.items():
            if not ended[wait_id]:
                open_waits[record.submission_id or ""].append(wait_id)
    for sub in subs.values():
        mine = open_waits.pop(sub.id, [])
        conv = sub.conversation_id
        if sub.status == WAITING and not mine:
            detail = f"{sub.id} is waiting without an open wait: nothing can ever resume it"
            found.append(Violation(WAITING_HAS_OPEN_WAIT, conv, detail))
        if sub.status == WAITING and sub.lease_owner is not None:
            detail = f"{sub.id} is waiting but holds a lease of {sub.lease_owner}"
            found.append(Violation(WAITING_HAS_OPEN_WAIT, conv, detail))
        if mine and sub.status != WAITING:
            detail = f"{sub.id} is {sub.status} with open wait(s) {', '.join(mine)}"
            found.append(Violation(WAITING_HAS_OPEN_WAIT, conv, detail))
    for sid, mine in open_waits.items():
        detail = f"open wait(s) {', '.join(mine)} of an unknown submission {sid!r}"
        found.append(Violation(WAITING_HAS_OPEN_WAIT, None, detail))
    return found


def _check_tool_log(log: ToolLog, reruns: Collection[tuple[str, str]] = ()) -> list[Violation]:
    """``reruns``: the ordinary calls that may run twice (their re-run after NotDone is on
    disk); every other ordinary call runs at most once."""
    found: list[Violation] = []
    ordinary: Counter[tuple[str, str]] = Counter()
    for run in log.runs:
        conv, call_id = run.conversation_id, run.tool_call_id
        if run.step is not None:
            on_disk = log.on_disk_after.get((conv, call_id, run.step))
            if on_disk is not None and run.run > on_disk:
                detail = (
                    f"step {run.step!r} of {call_id} ran in run {run.run},"
                    f" after its record was on disk (run {on_disk})"
                )
                found.append(Violation(STEP_RAN_AGAIN, conv, detail))
            continue
        on_disk = log.on_disk_after.get((conv, call_id, None))
        if on_disk is not None and run.run > on_disk:
            detail = f"call {call_id} ran in run {run.run}; its outcome was stored in {on_disk}"
            found.append(Violation(RECORDED_RAN_AGAIN, conv, detail))
        if not run.durable:
            ordinary[(conv, call_id)] += 1
    for (conv, call_id), n in ordinary.items():
        if n > 1 + ((conv, call_id) in reruns):
            found.append(Violation(ORDINARY_RAN_TWICE, conv, f"call {call_id} ran {n} times"))
    return found


__all__ = [
    "InvariantsBroken",
    "ToolLog",
    "ToolRun",
    "Violation",
    "assert_invariants",
    "check_invariants",
    "read_streams",
    "recorded_keys",
]
