"""Owner ids: telling a dead local process from a live one or one on another host."""

from __future__ import annotations

import subprocess
import sys
import time

from hearth.runtime.owner import OwnerIds, current_owner, is_dead_local, this_host


def test_the_current_process_is_alive() -> None:
    assert not is_dead_local(current_owner())


def test_runtimes_running_side_by_side_own_apart_and_die_with_their_process() -> None:
    class Runtime:
        pass

    ids = OwnerIds()
    first, second, third = Runtime(), Runtime(), Runtime()
    assert ids.take(first) == current_owner()
    assert ids.take(second) == f"{current_owner()}:2"
    ids.give_back(current_owner(), first)
    assert ids.take(third) == current_owner()  # (free again once its runtime stopped)
    assert not is_dead_local(f"{current_owner()}:2")
    host, boot, namespace, _, _ = current_owner().split(":")
    assert is_dead_local(f"{host}:{boot}:{namespace}:999999999:1:2")
    assert not is_dead_local(f"{host}:{boot}:{namespace}:999999999:1:x")


def test_a_finished_process_is_dead() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hearth.runtime.owner import current_owner; print(current_owner())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert is_dead_local(out.stdout.strip())


def test_a_reused_pid_with_another_start_time_is_dead() -> None:
    host, boot, namespace, pid, start = current_owner().split(":")
    assert is_dead_local(f"{host}:{boot}:{namespace}:{pid}:{int(start) + 1}")


def test_owners_on_other_hosts_or_unparseable_are_never_declared_dead() -> None:
    assert not is_dead_local(f"not-{this_host()}:abc:1:1:1")
    assert not is_dead_local("garbage")


def test_a_dead_pid_of_another_boot_or_pid_namespace_proves_nothing() -> None:
    """Two containers sharing a host name and boot (host networking) have PID namespaces of
    their own, and two machines may share a host name: each took the other's live processes
    for dead and expired their leases at every scan, interrupting their work."""
    host, boot, namespace, _, _ = current_owner().split(":")
    gone = "999999999"  # no such pid here
    assert is_dead_local(f"{host}:{boot}:{namespace}:{gone}:1")
    assert not is_dead_local(f"{host}:{boot}:{int(namespace) + 1}:{gone}:1")
    assert not is_dead_local(f"{host}:{'0' * 12}:{namespace}:{gone}:1")
    assert not is_dead_local(f"{host}:{boot}:{gone}:1")  # an earlier release's id: no namespace


def test_a_killed_process_not_yet_reaped_is_dead() -> None:
    """A zombie answers a signal 0 and keeps its start time: it was taken for alive, and a
    server restarted before its killed predecessor was reaped waited the whole lease (30 s) for
    the work that predecessor held."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from hearth.runtime.owner import current_owner;"
            " print(current_owner(), flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        owner = child.stdout.readline().strip()
        assert not is_dead_local(owner)  # running
        child.kill()
        for _ in range(500):  # until the kernel has made it a zombie (not reaped: no wait())
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert is_dead_local(owner)
    finally:
        child.kill()
        child.wait()
