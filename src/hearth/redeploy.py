"""The redeploy check (SPEC §17): what recovery would do to unsettled work under new code.

``check_store(store, agents)`` reads the records of every queued, running and waiting
submission — it never claims, writes or runs anything — renders each agent the way recovery
would (with its conversation's committed state, since what an agent declares may depend on
it), and asks recovery's own pure rules (``classify_recovery``, ``plan_tool_batch``) what the
next attempt would do. Whatever the new code would take away from work already accepted is a
``Finding``:

- ``durable_tool_withdrawn``: an unresolved call of a tool that recorded steps or a wait (so it
  was durable) is no longer declared, or no longer durable: it gets an ``interrupted`` marker
  instead of re-executing;
- ``tool_removed``: an unresolved call of a tool the new code does not declare at all; the
  records cannot tell whether it was durable, so it counts as withdrawn;
- ``wait_orphaned``: a pending durable wait whose tool is gone or no longer durable: resolving
  it would run nothing (the call gets a marker);
- ``delegate_removed``: an unresolved ``task`` call whose subagent is no longer declared (an
  error outcome ``subagent_missing``);
- ``agent_removed``: unsettled work of an agent no longer declared (it settles ``failed``
  with ``agent_missing``);
- ``render_failed``: the agent's function raises under the new code (the work would settle
  ``failed`` with ``agent_error``); reported, but not a withdrawn contract.

Example::

    report = await check_store(store, app.agents)
    print(*report.lines(), sep="\\n")
    sys.exit(1 if report.withdrawn else 0)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from hearth.agent import Agent, Rendered
from hearth.errors import StoreError
from hearth.records import (
    AssistantToolCall,
    Record,
    ToolStepSettled,
    WaitStarted,
)
from hearth.runtime.journal import Journal
from hearth.runtime.recovery import (
    BOOKKEEPING_STEPS,
    TASK_TOOL,
    Action,
    CallPlan,
    Evidence,
    MessageView,
    assemble_messages,
    classify_recovery,
    close_open_messages,
    plan_tool_batch,
)
from hearth.store.base import LIST_LIMIT, Store, Submission, Wait, all_submissions
from hearth.store.rows import OPEN, WAITING

DURABLE_TOOL_WITHDRAWN = "durable_tool_withdrawn"
TOOL_REMOVED = "tool_removed"
WAIT_ORPHANED = "wait_orphaned"
DELEGATE_REMOVED = "delegate_removed"
AGENT_REMOVED = "agent_removed"
RENDER_FAILED = "render_failed"
WITHDRAWING = frozenset(
    {DURABLE_TOOL_WITHDRAWN, TOOL_REMOVED, WAIT_ORPHANED, DELEGATE_REMOVED, AGENT_REMOVED}
)
MAX_DEPTH = 4  # delegation depth, as the runtime bounds it
# Decisions that end the work the same way under any code: a completed response, an abort
# intent, a deadline or a retry budget that ran out.
_SETTLES_ANYWAY = (Action.SETTLE_COMPLETED, Action.SETTLE_ABORTED, Action.SETTLE_FAILED)


@dataclass(frozen=True)
class Finding:
    """One thing recovery would do differently for accepted work under the new code."""

    kind: str
    conversation_id: str  # where it happens: the submission's, or a delegated child's
    message: str  # what recovery would do, in a sentence
    name: str | None = None  # the tool, subagent or agent concerned
    tool_call_id: str | None = None
    wait_id: str | None = None

    @property
    def withdraws(self) -> bool:
        """Whether a durable contract given to accepted work would be withdrawn."""
        return self.kind in WITHDRAWING

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "withdraws": self.withdraws,
            "conversation_id": self.conversation_id,
            "name": self.name,
            "tool_call_id": self.tool_call_id,
            "wait_id": self.wait_id,
            "message": self.message,
        }


@dataclass
class SubmissionCheck:
    """One unsettled submission and what the new code would change for it."""

    submission_id: str
    conversation_id: str
    status: str
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "submission_id": self.submission_id,
            "conversation_id": self.conversation_id,
            "status": self.status,
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass
class Report:
    """Every unsettled submission examined, in admission order."""

    submissions: list[SubmissionCheck]

    @property
    def affected(self) -> list[SubmissionCheck]:
        return [s for s in self.submissions if s.findings]

    @property
    def withdrawn(self) -> bool:
        """Whether any durable contract would be withdrawn (``hearth check`` exits 1)."""
        return any(f.withdraws for s in self.submissions for f in s.findings)

    def summary(self) -> str:
        withdrawing = sum(1 for s in self.affected if any(f.withdraws for f in s.findings))
        return (
            f"{len(self.submissions)} unsettled submission(s) checked; {len(self.affected)}"
            f" affected, {withdrawing} with a durable contract withdrawn"
        )

    def lines(self) -> list[str]:
        """One line per affected submission, then the summary."""
        out = []
        for s in self.affected:
            said = "; ".join(f"{f.kind}: {f.message}" for f in s.findings)
            out.append(f"{s.conversation_id} {s.submission_id} ({s.status}): {said}")
        return [*out, self.summary()]

    def to_json(self) -> dict[str, Any]:
        return {
            "withdrawn": self.withdrawn,
            "checked": len(self.submissions),
            "affected": [s.to_json() for s in self.affected],
            "summary": self.summary(),
        }


async def check_store(store: Store, agents: Mapping[str, Agent]) -> Report:
    """What recovery would do, under ``agents``, to every unsettled submission in ``store``."""
    now = await store.now()
    checks = []
    submissions = await all_submissions(store, statuses=OPEN)
    # Every pending wait read once (they were read again for each waiting submission: 10,000
    # of them took longer than any deploy waits), then handed to its submission.
    pending: dict[str, list[Wait]] = {}
    if any(sub.status == WAITING for sub in submissions):
        for wait in await _pending_waits(store):
            pending.setdefault(wait.submission_id, []).append(wait)
    for sub in submissions:
        check = SubmissionCheck(sub.id, sub.conversation_id, sub.status)
        waits = pending.get(sub.id, []) if sub.status == WAITING else []
        by_call = {(w.conversation_id, w.tool_call_id): w for w in waits}
        reader = _Reader(store, sub, now, by_call, check.findings)
        await reader.conversation(
            sub.conversation_id, agents.get(sub.agent), f"{sub.id}:input", depth=0
        )
        checks.append(check)
    return Report(checks)


async def _pending_waits(store: Store) -> list[Wait]:
    found: list[Wait] = []
    while True:
        page = await store.list_waits(after=found[-1].seq if found else 0)
        found += page
        if len(page) < LIST_LIMIT:
            return found


class _Reader:
    """Walks one submission's conversation, and its delegated children, as recovery would."""

    def __init__(
        self,
        store: Store,
        sub: Submission,
        now: float,
        waits: dict[tuple[str, str], Wait],
        findings: list[Finding],
    ) -> None:
        self.store = store
        self.sub = sub
        self.now = now
        # (conversation, tool_call_id) → its pending wait: a provider may number its calls in
        # each conversation from 0, so a parent's call and a child's can share an id
        self.waits = waits
        self.findings = findings

    async def conversation(
        self, conversation_id: str, agent: Agent | None, input_id: str, *, depth: int
    ) -> None:
        journal = Journal(self.store, conversation_id, self.sub.fence)
        await journal.load_for(self.sub.id)  # what the runner loads
        records = journal.records
        mine = _from_input(records, input_id)
        rendered: Rendered | None = None
        if agent is not None:
            try:
                rendered = agent.render(
                    conversation_id.split("/", 1)[1], await self.store.get_state(conversation_id)
                )
            except Exception as exc:  # the new code's own bug: reported, as recovery would
                self.findings.append(
                    Finding(
                        RENDER_FAILED,
                        conversation_id,
                        f"rendering {agent.name!r} raises {type(exc).__name__}: {exc}; the"
                        " work would settle failed (agent_error)",
                        name=agent.name,
                    )
                )
                return
        decision = classify_recovery(self._evidence(mine, rendered))
        if agent is None:
            if decision.action not in _SETTLES_ANYWAY:
                name = conversation_id.split("/", 1)[0]
                self.findings.append(
                    Finding(
                        AGENT_REMOVED,
                        conversation_id,
                        f"agent {name!r} is no longer declared: the submission settles failed"
                        " (agent_missing)",
                        name=name,
                    )
                )
            return
        if decision.action is not Action.RUN_TOOLS or rendered is None:
            return
        view = next(v for v in assemble_messages(mine) if v.message_id == decision.message_id)
        await self._batch(conversation_id, records, view, rendered, depth)

    def _evidence(self, mine: list[Record], rendered: Rendered | None) -> Evidence:
        sub = self.sub
        closed = [*mine, *close_open_messages(mine)]  # recovery's phase 1, not written here
        deadline = sub.deadline is not None and sub.status != WAITING and self.now >= sub.deadline
        return Evidence(
            records=closed,
            input_appended=bool(mine),
            attempt=sub.attempt + 1,  # the attempt recovery would start
            waits=sub.waits,
            releases=sub.releases,
            max_attempts=sub.max_attempts,
            deadline_passed=deadline,
            abort_requested=sub.abort_requested_at is not None,
            start_hooks=bool(rendered and rendered.on_start),
            finish_hooks=bool(rendered and rendered.on_finish),
        )

    async def _batch(
        self,
        conversation_id: str,
        records: Sequence[Record],
        view: MessageView,
        rendered: Rendered,
        depth: int,
    ) -> None:
        declared = {name: t.durable for name, t in rendered.tools.items()}
        plan = plan_tool_batch(view, self.sub.attempt + 1, declared, list(rendered.subagents))
        durable = _durable_evidence(records)
        for call in view.calls:
            verdict = plan[call.tool_call_id]
            if verdict is CallPlan.CHILD_GONE:
                self.findings.append(self._delegate_removed(conversation_id, call))
            elif verdict is CallPlan.RESUME_CHILD and depth < MAX_DEPTH:
                child = view.children.get(call.tool_call_id)
                args = call.arguments if isinstance(call.arguments, dict) else {}
                sub = rendered.subagents.get(str(args.get("agent")))
                if child is not None and sub is not None:
                    await self.conversation(child, sub.agent, f"{child}:input", depth=depth + 1)
            elif verdict is CallPlan.REEXECUTE:
                finding = self._refused_arguments(conversation_id, call, rendered)
                if finding is not None:
                    self.findings.append(finding)
            elif verdict is CallPlan.INTERRUPTED:
                was_durable = call.tool_call_id in durable
                finding = self._marked(conversation_id, call, declared, was_durable)
                if finding is not None:
                    self.findings.append(finding)

    def _delegate_removed(self, conversation_id: str, call: AssistantToolCall) -> Finding:
        args = call.arguments if isinstance(call.arguments, dict) else {}
        name = str(args.get("agent"))
        return Finding(
            DELEGATE_REMOVED,
            conversation_id,
            f"subagent {name!r} of task call {call.tool_call_id} is no longer declared: the call"
            " gets an error outcome (subagent_missing) instead of resuming its child",
            name=name,
            tool_call_id=call.tool_call_id,
        )

    def _refused_arguments(
        self, conversation_id: str, call: AssistantToolCall, rendered: Rendered
    ) -> Finding | None:
        """The finding for a durable call that the new code's tool would refuse, as recovery
        validates its recorded arguments again before it re-executes: it gets a validation
        error outcome, and its recorded steps are dropped."""
        try:
            rendered.tools[call.name].validate(call.arguments)
        except Exception as exc:
            first = str(exc).splitlines()
            why = (" ".join(first[1:3]).strip() if len(first) > 1 else str(exc))[:200]
            return Finding(
                DURABLE_TOOL_WITHDRAWN,
                conversation_id,
                f"durable tool {call.name!r} no longer takes the arguments of call"
                f" {call.tool_call_id} ({why}): it gets a validation error instead of"
                " re-executing with its recorded steps",
                name=call.name,
                tool_call_id=call.tool_call_id,
            )
        return None

    def _marked(
        self,
        conversation_id: str,
        call: AssistantToolCall,
        declared: dict[str, bool],
        was_durable: bool,
    ) -> Finding | None:
        """The finding for a call that would get an ``interrupted`` marker, if the new code is
        why (an ordinary tool still declared gets its marker under any code)."""
        name, where = call.name, call.tool_call_id
        now = "no longer declared" if name not in declared else "no longer durable"
        wait = self.waits.get((conversation_id, where))
        if wait is not None:
            return Finding(
                WAIT_ORPHANED,
                conversation_id,
                f"wait {wait.wait_id} ({wait.name!r}) of tool {name!r}: the tool is {now}, so"
                " resolving the wait runs nothing; the call gets an interrupted marker",
                name=name,
                tool_call_id=where,
                wait_id=wait.wait_id,
            )
        if was_durable:
            return Finding(
                DURABLE_TOOL_WITHDRAWN,
                conversation_id,
                f"durable tool {name!r} is {now}: call {where} gets an interrupted marker"
                " instead of re-executing with its recorded steps",
                name=name,
                tool_call_id=where,
            )
        if name not in declared and name != TASK_TOOL:
            return Finding(
                TOOL_REMOVED,
                conversation_id,
                f"tool {name!r} is no longer declared: call {where} gets an interrupted marker"
                " (had it been durable, it would have re-executed)",
                name=name,
                tool_call_id=where,
            )
        return None


def _from_input(records: list[Record], input_id: str) -> list[Record]:
    """The records from the loop's input on (empty before it was appended), as the runner
    finds them."""
    for i in range(len(records) - 1, -1, -1):
        if records[i].id == input_id:
            return records[i:]
    return []


def _durable_evidence(records: Sequence[Record]) -> set[str]:
    """The tool calls that recorded a step or began a wait: only durable tools do. (The record
    of a reconciled call's run again, and that of a call's state writes, are steps of hearth's
    own, of any tool.)"""
    return {
        r.tool_call_id
        for r in records
        if isinstance(r, WaitStarted)
        or (isinstance(r, ToolStepSettled) and r.step not in BOOKKEEPING_STEPS)
    }


async def check_database(db: str | None, agents: Mapping[str, Agent]) -> Report:
    """``check_store`` on the database ``db`` names, opened for this check only. A SQLite file
    must exist (the check creates nothing) and no process may hold it: one process owns a
    SQLite file, so stop the server first. On PostgreSQL it runs beside the servers."""
    from hearth.app import open_database
    from hearth.config import shown_db
    from hearth.store import open_store
    from hearth.store.sqlite import SQLiteStore

    probe = open_store(db, pg_pool=1)
    if not isinstance(probe, SQLiteStore):
        # (Opening migrates an older schema, as the new release's first process would: the
        # older processes carry on with it, as in any rolling redeploy.)
        store = await open_database(db, pg_pool=1, existing=True)
        try:
            return await check_store(store, agents)
        finally:
            await store.close()
    if probe.path == ":memory:" or not _exists(probe.path):
        raise StoreError(f"no database at {shown_db(db)}: there is nothing to check")
    if not _regular(probe.path):  # (reading a FIFO waited for a writer, for good)
        raise StoreError(f"{shown_db(db)} is not a file: there is no database to check")
    # A copy is checked: opening the file itself would migrate an older schema in place, and
    # the release still running it would then refuse to start ("made by a newer hearth").
    with tempfile.TemporaryDirectory(prefix=".hearth-check-", dir=_folder(probe.path)) as tmp:
        copy, source = os.path.join(tmp, "copy.db"), probe.path
        if _read_only_mount(source):
            # No process writes there: the files are copied as they are (SQLite cannot read a
            # WAL database where it may not write its index), then read as any other.
            source = os.path.join(tmp, "source.db")
            await asyncio.to_thread(_copy_files, probe.path, source)
        await asyncio.to_thread(_copy_sqlite, source, copy, shown_db(db))
        # The path as it is (a URL would read "?" in it as options); create=False: another
        # program's SQLite file is refused, not given hearth's schema.
        store = SQLiteStore(copy)
        await store.open(create=False)
        try:
            return await check_store(store, agents)
        finally:
            await store.close()


def _folder(path: str) -> str | None:
    """Where the copy goes: beside the file, or the system's temporary folder when that one
    cannot be written (a backup on a read-only mount is checked too)."""
    folder = os.path.dirname(os.path.abspath(path))
    return folder if os.access(folder, os.W_OK | os.X_OK) else None


def _read_only_mount(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _copy_files(path: str, copy: str) -> None:
    for suffix in ("", "-wal"):
        if os.path.exists(path + suffix):
            shutil.copyfile(path + suffix, copy + suffix)


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _copy_sqlite(path: str, copy: str, shown: str) -> None:
    """A consistent copy of the SQLite file at ``path`` (its WAL included), read only."""
    try:
        # Percent-encoded: a "#" or "?" in the path would end it, and another file be read.
        uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
        source = sqlite3.connect(uri, uri=True, timeout=0.5)
        try:
            # Read once first: held by a server, this raises "locked" (a backup would wait,
            # retrying, for as long as the server runs).
            source.execute("SELECT count(*) FROM sqlite_master").fetchone()
            target = sqlite3.connect(copy)
            try:
                source.backup(target)
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):
            raise StoreError(
                f"a running process holds the SQLite file {shown}; stop the server first (one"
                " process owns a SQLite file), then check"
            ) from None
        raise StoreError(f"cannot read the database {shown}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot read the database {shown}: {exc}") from None


def _exists(path: str) -> bool:
    return os.path.exists(path)
