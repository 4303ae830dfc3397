"""Owner ids that tell whether their process is still alive on this host.

``host:boot:pid:start`` — a process on the same host whose pid is gone, or now belongs to a
process that started at another time, or that ran before the last boot, is dead: its work can be
taken over at once instead of waiting for its lease to expire.
"""

from __future__ import annotations

import os
import socket
from functools import cache


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")[:12]
    except OSError:
        return "noboot"


def _start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (starttime); the command name in field 2 may contain spaces, so split after ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


@cache
def this_host() -> str:
    return socket.gethostname().replace(":", "_")


def current_owner() -> str:
    pid = os.getpid()
    return f"{this_host()}:{_boot_id()}:{pid}:{_start_ticks(pid) or 'x'}"


def is_dead_local(owner: str) -> bool:
    """True only when the owner is provably a dead process of this host."""
    parts = owner.split(":")
    if len(parts) != 4 or parts[0] != this_host():
        return False
    _, boot, pid_text, start = parts
    if boot != _boot_id():
        return True
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    ticks = _start_ticks(pid)
    return ticks is None or (start != "x" and ticks != start)
