"""The log a crash test's tools keep of their own executions, and the trace of kill points reached.

Apps under a crash test call ``ran(what, ctx)`` inside each tool body and step; each call appends
one line ``what|conversation|tool_call_id|run`` to ``$HEARTH_TEST_LOG`` (``run`` is the harness's
``HEARTH_CRASH_RUN``). ``what`` is the tool's name (an ordinary call), ``<tool>-start`` (a durable
tool's body), ``step-<name>`` (a step's body), or anything in ``NOT_TOOLS`` for lines the checker
does not judge. ``tool_runs(path)`` turns the log into the ``ToolRun`` list the invariant checker
takes.

``trace_points()`` makes this process log each kill point it reaches to ``$HEARTH_TRACE_POINTS``
as ``run|point``: what a run reached is what a kill planned in its place can hit.

Example (inside a scenario app)::

    @hearth.tool
    async def lookup(n: int, ctx: hearth.ToolContext) -> str:
        ran("lookup", ctx)
        return f"found {n}"
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from hearth import _faults
from hearth.testing.invariants import ToolRun

if TYPE_CHECKING:
    from hearth.tools import ToolContext

NOT_TOOLS = ("hook",)  # log lines that are not tool or step executions


def ran(what: str, ctx: ToolContext | None = None, *, conversation: str = "") -> None:
    """Log one execution to ``$HEARTH_TEST_LOG`` (when set)."""
    path = os.environ.get("HEARTH_TEST_LOG")
    if not path:
        return
    conv = ctx.conversation_id if ctx is not None else conversation
    call_id = ctx.tool_call_id if ctx is not None else ""
    run = os.environ.get("HEARTH_CRASH_RUN", "0")
    with open(path, "a") as f:
        f.write(f"{what}|{conv}|{call_id}|{run}\n")


def log_lines(path: str | os.PathLike[str]) -> list[list[str]]:
    """The log's lines, split into their four fields (an absent log is empty)."""
    p = Path(path)
    text = p.read_text() if p.exists() else ""
    return [line.split("|") for line in text.splitlines() if line]


def tool_runs(path: str | os.PathLike[str]) -> list[ToolRun]:
    """The executions in the log at ``path``, as the invariant checker takes them."""
    runs = []
    for what, conv, call_id, run in log_lines(path):
        if what in NOT_TOOLS:
            continue
        step = what[len("step-") :] if what.startswith("step-") else None
        durable = what.endswith("-start")
        runs.append(ToolRun(conv, call_id, int(run), step=step, durable=durable))
    return runs


def trace_points() -> None:
    """Log each kill point this process reaches to ``$HEARTH_TRACE_POINTS`` (when set)."""
    path = os.environ.get("HEARTH_TRACE_POINTS")
    if not path or getattr(_faults.reached, "traced", False):
        return
    original = _faults.reached

    def reached(point: str) -> None:
        # The run is read at each point: a process started ahead of time learns it later.
        run = os.environ.get("HEARTH_CRASH_RUN", "0")
        with open(path, "a") as f:
            f.write(f"{run}|{point}\n")
        original(point)

    reached.traced = True  # type: ignore[attr-defined]
    _faults.reached = reached


def points_reached(path: str | os.PathLike[str], run: int | None = None) -> Counter[str]:
    """How often each kill point was reached (in one run, or in all) per the trace at ``path``."""
    p = Path(path)
    text = p.read_text() if p.exists() else ""
    lines = (line.partition("|") for line in text.splitlines())
    return Counter(point for r, _, point in lines if run is None or r == str(run))


__all__ = ["NOT_TOOLS", "log_lines", "points_reached", "ran", "tool_runs", "trace_points"]
