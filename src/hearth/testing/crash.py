"""A crash harness: run an app in a child process and SIGKILL it at a named point.

Example (in a test)::

    harness = CrashHarness("myapp:app", db=tmp_path / "h.db")
    first = harness.run(dispatch=[("support", "c-1", "refund order 7")], crash_at="tool:refund")
    assert first.killed
    harness.run()  # a new process recovers the work and waits until everything settles
    records = harness.history("support/c-1")

Crash points: ``before:<record type>`` / ``after:<record type>`` (around the append of a batch
holding that type), ``before:store.<method>`` / ``after:store.<method>`` (around each store write),
``tool:<name>`` (a tool call starts), ``tool-done:<name>`` (its body returned, its outcome is not
recorded), ``step:<name>`` (a ``step.do`` is about to run its function), ``hook:<name>`` (an event
hook starts), and more: ``hearth.testing.KILL_POINTS`` lists them all. ``#N`` picks the N-th time
the point is reached in that process, e.g. ``after:assistant_text_delta#2``.

Each child sees ``HEARTH_CRASH_RUN`` (0, 1, …: which run of this harness it is), so that a tool
can log which process ran it; after each run the harness notes which outcomes and steps are on
disk, and ``assert_invariants(tool_runs)`` checks the database (``hearth.testing.invariants``).
A run whose log shows an unexpected exception in an attempt raises ``RuntimeError``: the
coordinator would release such work for a retry, which must not hide a bug.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hearth.records import Record
from hearth.runtime.coordinator import UNEXPECTED
from hearth.store import open_store
from hearth.store.base import Submission, all_submissions
from hearth.testing.invariants import (
    InvariantsBroken,
    Key,
    ToolLog,
    ToolRun,
    Violation,
    check_invariants,
    recorded_keys,
)
from hearth.testing.points import check_crash_at

Message = str | dict[str, Any]  # a text message, or a signal
MidTool = tuple[str, str, str, Message | None]  # (action, agent, id, message)


@dataclass
class ChildRun:
    """How one child process ended."""

    returncode: int
    receipts: list[dict[str, Any]] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def ok(self) -> bool:
        return self.returncode == 0


T = TypeVar("T")


def _run(work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)``; from code already in an event loop (an async test, a notebook),
    on a thread of its own, since a loop cannot run inside another."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hearth-harness") as pool:
        return pool.submit(asyncio.run, work).result()


class CrashHarness:
    """Runs ``module:attribute`` (a ``hearth.App``) in child processes on one SQLite file."""

    def __init__(
        self,
        app: str,
        db: str | os.PathLike[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        pythonpath: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        self.app = app
        self.db = str(db)
        self.cwd = str(cwd) if cwd is not None else None
        self.env = dict(env or {})
        self.pythonpath = [str(p) for p in pythonpath]
        self.runs = 0  # children started so far
        self.kills = 0  # children that died at their crash point
        self.on_disk_after: dict[Key, int] = {}  # outcome/step → the run after which it was stored

    def _environ(self, crash_at: str | None, extra: dict[str, str] | None) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("HEARTH_CRASH_AT", None)
        env.update(self.env)
        env.update(extra or {})
        env["HEARTH_CRASH_RUN"] = str(self.runs)
        if crash_at:
            env["HEARTH_CRASH_AT"] = check_crash_at(crash_at)
        paths = [*self.pythonpath, env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        return env

    def run(
        self,
        *,
        dispatch: Sequence[tuple[str, str, Message]] = (),
        crash_at: str | None = None,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        abort: Sequence[tuple[str, str]] = (),
        mid_tool: Sequence[MidTool] = (),
        idle: float = 0.0,
    ) -> ChildRun:
        """Start a child on the database, admit ``dispatch`` messages (agent, id, text, or a
        signal as a dict), stamp ``abort`` intents, then wait until nothing is queued or running,
        or until the child dies at ``crash_at``. ``idle`` keeps the child alive that many seconds
        more. ``mid_tool`` actions ``(action, agent, id, message)`` each wait, in order, until
        that conversation has a tool call recorded, then ``"dispatch"`` the message, ``"abort"``
        the conversation, or ``"shutdown"`` (the child stops without waiting for its work)."""
        spec = {
            "app": self.app,
            "db": self.db,
            "dispatch": [list(d) for d in dispatch],
            "abort": [list(a) for a in abort],
            "mid_tool": [list(m) for m in mid_tool],
            "timeout": timeout,
            "idle": idle,
        }
        proc = subprocess.run(
            [sys.executable, "-m", "hearth.testing._child", json.dumps(spec)],
            env=self._environ(crash_at, env),
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            check=False,
        )
        receipts = []
        for line in proc.stdout.splitlines():
            if line.startswith("receipt "):
                receipts.append(json.loads(line[len("receipt ") :]))
        result = ChildRun(proc.returncode, receipts, proc.stdout, proc.stderr)
        if not result.ok and not result.killed:
            raise RuntimeError(f"child exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
        if UNEXPECTED in proc.stderr:  # a bug must not pass as a retry
            raise RuntimeError(f"the child's runtime raised:\n{proc.stderr[-4000:]}")
        for key in _run(self._with_store(recorded_keys)):
            self.on_disk_after.setdefault(key, self.runs)
        self.runs += 1
        self.kills += result.killed
        return result

    def run_until_settled(self, *, max_runs: int = 20, timeout: float = 60.0) -> int:
        """Restart the app until it exits cleanly (everything settled); return how many runs."""
        for n in range(1, max_runs + 1):
            if self.run(timeout=timeout).ok:
                return n
        raise RuntimeError(f"work did not settle in {max_runs} runs")

    # --- inspecting the database after the child is gone ----------------------------------
    def history(self, conversation_id: str) -> list[Record]:
        return _run(self._with_store(lambda s: s.read(conversation_id)))

    def submissions(self, conversation_id: str | None = None) -> list[Submission]:
        return _run(self._with_store(lambda s: all_submissions(s, conversation_id)))

    def request_abort(self, conversation_id: str) -> list[str]:
        """Stamp an abort intent while no process is running (as a peer process would)."""
        return _run(self._with_store(lambda s: s.request_abort(conversation_id)))

    def state(self, conversation_id: str) -> dict[str, Any]:
        return _run(self._with_store(lambda s: s.get_state(conversation_id)))

    def check_invariants(self, tool_runs: Sequence[ToolRun] | None = None) -> list[Violation]:
        """``hearth.testing.invariants.check_invariants`` on the database, with the tools' log
        (``ToolRun.run`` being ``HEARTH_CRASH_RUN``) judged against what each run left on disk."""
        log = None if tool_runs is None else ToolLog(list(tool_runs), self.on_disk_after)
        return _run(self._with_store(lambda s: check_invariants(s, tool_log=log)))

    def assert_invariants(self, tool_runs: Sequence[ToolRun] | None = None) -> None:
        """``check_invariants``, raising ``InvariantsBroken`` (an ``AssertionError``)."""
        found = self.check_invariants(tool_runs)
        if found:
            raise InvariantsBroken(found)

    async def _with_store(self, fn: Any) -> Any:
        return await with_store(self.db, fn)


async def with_store(db: str, fn: Any) -> Any:
    """``await fn(store)`` on the database at ``db``, opened for the call and closed after."""
    store = open_store(db)
    await store.open()
    try:
        return await fn(store)
    finally:
        await store.close()
