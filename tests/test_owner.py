"""Owner ids: telling a dead local process from a live one or one on another host."""

from __future__ import annotations

import subprocess
import sys

from hearth.runtime.owner import current_owner, is_dead_local, this_host


def test_the_current_process_is_alive() -> None:
    assert not is_dead_local(current_owner())


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
    host, boot, pid, start = current_owner().split(":")
    assert is_dead_local(f"{host}:{boot}:{pid}:{int(start) + 1}")


def test_owners_on_other_hosts_or_unparseable_are_never_declared_dead() -> None:
    assert not is_dead_local(f"not-{this_host()}:abc:1:1")
    assert not is_dead_local("garbage")
