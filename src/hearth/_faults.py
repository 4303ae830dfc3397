"""Named crash points for fault-injection tests.

``HEARTH_CRASH_AT`` names one point, optionally ``#N`` for its N-th occurrence in this process
(default 1). When the running code reaches it, the process SIGKILLs itself: no ``finally`` runs, no
buffer is flushed — the same as a power cut for everything above the disk. ``a>b`` chains points:
the kill comes at ``b`` once ``a`` was reached (``after:store.admit>store:commit-begin#2`` is the
second commit after the first admission). The names, and where each one sits, are listed in
``hearth.testing.points`` (``KILL_POINTS``).

A point that is not the armed one costs one comparison: call sites stay on hot paths.
"""

from __future__ import annotations

import os
import signal

_stages: list[tuple[str, int]] = []  # the points still to reach, with their occurrence
_target: str | None = None
_nth = 1
_seen = 0


def configure(spec: str | None) -> None:
    """Arm ``spec`` (``name``, ``name#N``, ``a>b#N``), or disarm with None or ``""``."""
    global _stages
    stages = []
    for part in (spec or "").split(">"):
        name, hash_, count = part.strip().partition("#")
        if hash_ and not (count.isascii() and count.isdigit() and int(count) >= 1):
            raise ValueError(f"HEARTH_CRASH_AT={spec!r}: #{count} must be a whole number from 1")
        if name:
            stages.append((name, int(count) if count else 1))
    _stages = stages
    _next_stage()


def _next_stage() -> None:
    global _target, _nth, _seen
    _seen = 0
    _target, _nth = _stages.pop(0) if _stages else (None, 1)


def reached(point: str) -> None:
    """Kill this process if ``point`` is the armed crash point (its N-th occurrence)."""
    global _seen
    if point != _target:
        return
    _seen += 1
    if _seen < _nth:
        return
    if _stages:
        _next_stage()
    else:
        os.kill(os.getpid(), signal.SIGKILL)


try:
    configure(os.environ.get("HEARTH_CRASH_AT"))
except ValueError as exc:
    # (a traceback from every import of hearth, before any command could say it in one line)
    raise SystemExit(f"hearth: {exc}") from None
