"""Owner ids that tell whether their process is still alive on this host.

``host:boot:pidns:pid:start`` — a process that shares this process's host name, boot and PID
namespace, and whose pid is gone (or now belongs to a process that started at another time), is
dead: its work can be taken over at once instead of waiting for its lease to expire. Anything
less is not proof: two containers with one host name and boot (host networking) have PID
namespaces of their own, two machines may share a host name, and a rebooted host's old owners
are as well waited for as a live peer's; their leases decide.

A second runtime running in the same process at the same time owns apart from the first (each
renews and gives back only its own leases): its id ends ``:2`` (``:3``…), see ``OwnerIds``.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from functools import cache

UNKNOWN = "x"  # a part that could not be read: nothing is proven with it


@cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")[:12] or UNKNOWN
    except OSError:
        return UNKNOWN


@cache
def _pid_namespace() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return UNKNOWN
    digits = "".join(c for c in link if c.isdigit())
    return digits or UNKNOWN


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/{pid}/stat`` from field 3 (the state) on; None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name in field 2 may contain spaces and parentheses: split after the last ')'.
    return stat.rsplit(")", 1)[1].split()


def _start_ticks(pid: int) -> str | None:
    fields = _stat_fields(pid)  # field 22: starttime
    return fields[19] if fields is not None and len(fields) > 19 else None


def _ended(pid: int) -> bool:
    """Whether ``pid`` has ended and waits to be reaped (a zombie, state Z or X): it owns
    nothing any more, though it still answers a signal 0 (a supervisor that restarts a killed
    server before it reaps it left the new one waiting the whole lease for its work)."""
    fields = _stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] in ("Z", "X")


@cache
def this_host() -> str:
    return socket.gethostname().replace(":", "_")


def current_owner() -> str:
    pid = os.getpid()
    return f"{this_host()}:{_boot_id()}:{_pid_namespace()}:{pid}:{_start_ticks(pid) or UNKNOWN}"


class OwnerIds:
    """The owner ids of the runtimes running in this process: the first takes the process's
    own id, each other one running beside it that id and ``:n``. An id is free again once its
    holder (a coordinator) stopped or is gone."""

    def __init__(self) -> None:
        self._held: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def take(self, holder: object) -> str:
        base = current_owner()
        with self._lock:
            n = 1
            while (owner := base if n == 1 else f"{base}:{n}") in self._held:
                n += 1
            self._held[owner] = holder
        return owner

    def give_back(self, owner: str, holder: object) -> None:
        with self._lock:
            if self._held.get(owner) is holder:
                del self._held[owner]


owner_ids = OwnerIds()


def is_dead_local(owner: str) -> bool:
    """True only when the owner is provably a dead process of this host, boot and PID
    namespace. (An owner id of an earlier release, without its namespace, proves nothing.)"""
    parts = owner.split(":")
    if len(parts) == 6 and parts[5].isascii() and parts[5].isdigit():
        parts = parts[:5]  # one of several runtimes of its process: the process decides
    if len(parts) != 5:
        return False
    host, boot, namespace, pid_text, start = parts
    if (host, boot, namespace) != (this_host(), _boot_id(), _pid_namespace()):
        return False
    if UNKNOWN in (boot, namespace) or not pid_text.isascii() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid <= 0:
        return False
    exists = _exists(pid)
    if exists is None:
        return False
    if not exists:
        return True
    ticks = _start_ticks(pid)  # (None when /proc hides it: then not proven)
    if _ended(pid) and ticks == start:
        return True  # the owner itself, ended
    # Alive under that pid: dead only if it is another process than the owner (a reused pid).
    return ticks is not None and start != UNKNOWN and ticks != start


def _exists(pid: int) -> bool | None:
    """Whether ``pid`` exists here (one of another user's answers PermissionError); None when
    it cannot be told."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return None
    return True
