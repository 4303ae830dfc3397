"""Named crash points for fault-injection tests.

``HEARTH_CRASH_AT`` names one point (``after:<record type>``, ``before:<record type>``,
``tool:<name>``, ``step:<name>``, ``hook:<name>``), optionally ``#N`` for its N-th occurrence in
this process (default 1). When the running code reaches it, the process SIGKILLs itself: no
``finally`` runs, no buffer is flushed — the same as a power cut for everything above the disk.
"""

from __future__ import annotations

import os
import signal

_target: str | None = None
_nth = 1
_seen = 0
_loaded = False


def _load() -> None:
    global _target, _nth, _loaded
    _loaded = True
    spec = os.environ.get("HEARTH_CRASH_AT", "").strip()
    if not spec:
        return
    name, _, count = spec.partition("#")
    _target = name
    _nth = int(count) if count else 1


def reached(point: str) -> None:
    """Kill this process if ``point`` is the configured crash point (its N-th occurrence)."""
    global _seen
    if not _loaded:
        _load()
    if _target is None or point != _target:
        return
    _seen += 1
    if _seen >= _nth:
        os.kill(os.getpid(), signal.SIGKILL)
