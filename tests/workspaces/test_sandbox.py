"""``run`` under bubblewrap (SPEC §16): only the workspace is writable, there is no network, and
the limits on memory and processes bind (also when hearth runs as root, as in CI). Each
confinement test first runs the same command unsandboxed, to show that it would do harm."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import hearth

pytestmark = pytest.mark.anyio


# The sandbox shows the host's /usr: the tests that need a program to open sockets or start
# processes with use Debian's python3 there.
HAS_PYTHON = Path("/usr/bin/python3").exists()


def exists(path: Path) -> bool:
    return path.exists()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def opened(
    tmp_path: Path, *, sandbox: bool = True, limits: hearth.RunLimits | None = None
) -> hearth.OpenWorkspace:
    ws = hearth.LocalWorkspace(tmp_path / "root", sandbox=sandbox, limits=limits)
    return await ws.open("coder/c-1", submission_id="s_1", attempt=1)


@pytest.fixture
async def sandboxed(tmp_path: Path, bwrap: str) -> AsyncIterator[hearth.OpenWorkspace]:
    yield await opened(tmp_path)


@pytest.fixture
def host_tmp_marker() -> Iterator[Path]:
    path = Path("/tmp") / f"hearth-sandbox-test-{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)


async def test_run_cannot_write_outside_the_workspace(
    tmp_path: Path, sandboxed: hearth.OpenWorkspace, host_tmp_marker: Path
) -> None:
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("original")
    command = (
        f"echo changed > {victim}; echo made > {host_tmp_marker}; echo made > ../escape; "
        f"touch /usr/hearth-sandbox-test; echo inside > kept.txt; echo finished"
    )
    result = await sandboxed.run(command, timeout=30)
    assert "finished" in result.output
    assert victim.read_text() == "original"
    assert not exists(host_tmp_marker)
    assert not exists(tmp_path / "root" / "coder" / "escape")
    assert not exists(Path("/usr/hearth-sandbox-test"))
    assert await sandboxed.read_file("kept.txt") == "inside\n"
    # The same command unsandboxed does write outside: the check above could fail.
    plain = await opened(tmp_path, sandbox=False)
    await plain.run(f"echo changed > {victim}; echo made > {host_tmp_marker}", timeout=30)
    assert victim.read_text() == "changed\n" and exists(host_tmp_marker)


def connect_command(port: int) -> str:
    return (
        '/usr/bin/python3 -c "import socket; '
        f"socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')\""
    )


def pending_connection(listener: socket.socket) -> bool:
    readable, _, _ = select.select([listener], [], [], 0)
    return bool(readable)


def need_system_python(purpose: str) -> None:
    """These checks run Debian's python3 inside the sandbox; in CI its absence fails the run."""
    if HAS_PYTHON:
        return
    reason = f"the sandbox's system has no /usr/bin/python3 to {purpose}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


async def test_run_cannot_reach_the_network(
    tmp_path: Path, sandboxed: hearth.OpenWorkspace
) -> None:
    need_system_python("open a connection with")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        result = await sandboxed.run(connect_command(port), timeout=30)
        assert result.exit_code != 0
        assert "connected" not in result.output
        assert not pending_connection(listener)
        # Unsandboxed, the same command reaches the listener.
        plain = await opened(tmp_path, sandbox=False)
        reached = await plain.run(connect_command(port), timeout=30)
        assert reached.exit_code == 0, reached.output
        assert pending_connection(listener)


SPAWN = (
    "/usr/bin/python3 -c '\n"
    "import subprocess\n"
    "started = []\n"
    "for _ in range(20):\n"
    "    try:\n"
    '        started.append(subprocess.Popen(["sleep", "5"]))\n'
    "    except OSError:\n"
    "        break\n"
    'print("started", len(started))\n'
    "'"
)


def started(result: hearth.RunResult) -> int:
    line = next(x for x in result.output.splitlines() if x.startswith("started "))
    return int(line.split()[1])


async def test_the_few_files_of_etc_shown_can_be_read_by_the_command(
    sandboxed: hearth.OpenWorkspace,
) -> None:
    """Run as root (CI), bwrap made the sandbox's /etc 0700: the command, dropped to nobody,
    could read none of it (no user name; awk, an alternative, would not start)."""
    result = await sandboxed.run(
        "set -e; stat -c %a /etc; head -c 4 /etc/passwd; echo; id -un;"
        " echo x | awk '{print \"awk\"}'",
        timeout=30,
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "755" and lines[1] == "root", result.output
    assert lines[2], result.output  # a name (nobody, run as root)
    assert lines[3] == "awk", result.output


async def test_the_process_limit_binds(tmp_path: Path, bwrap: str) -> None:
    need_system_python("start processes with")
    capped = await opened(tmp_path, limits=hearth.RunLimits(processes=8))
    result = await capped.run(SPAWN, timeout=30)
    assert started(result) < 8, result.output  # python itself is one of the 8
    roomy = await opened(tmp_path)
    result = await roomy.run(SPAWN, timeout=30)
    assert started(result) == 20, result.output


ALLOCATE = "/usr/bin/python3 -c 'x = bytearray({mb} * 1024 * 1024); print(\"allocated\")'"


async def test_the_memory_limit_binds(tmp_path: Path, bwrap: str) -> None:
    need_system_python("allocate with")
    capped = await opened(tmp_path, limits=hearth.RunLimits(memory_bytes=200 * 1024**2))
    result = await capped.run(ALLOCATE.format(mb=400), timeout=30)
    assert result.exit_code != 0 and "MemoryError" in result.output
    fits = await capped.run(ALLOCATE.format(mb=20), timeout=30)
    assert fits.exit_code == 0 and "allocated" in fits.output


async def test_a_timeout_is_bounded_by_the_configured_maximum(tmp_path: Path, bwrap: str) -> None:
    ws = await opened(tmp_path, limits=hearth.RunLimits(max_timeout=0.5))
    result = await ws.run("sleep 30; echo too-late", timeout=3600)
    assert result.timed_out and "too-late" not in result.output


@pytest.fixture
def no_bwrap_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH where bubblewrap is absent but the other tools ``run`` uses are there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("prlimit", "sh"):
        found = shutil.which(tool)
        assert found is not None
        os.symlink(found, bin_dir / tool)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert shutil.which("bwrap") is None


async def test_without_bubblewrap_run_is_refused(tmp_path: Path, no_bwrap_on_path: None) -> None:
    ws = await opened(tmp_path)
    with pytest.raises(hearth.SandboxUnavailable, match="bubblewrap"):
        await ws.run("echo hi > made.txt", timeout=5)
    assert await ws.list_files() == []


async def test_an_app_that_opts_out_runs_without_bubblewrap(
    tmp_path: Path, no_bwrap_on_path: None
) -> None:
    ws = await opened(tmp_path, sandbox=False)
    result = await ws.run("echo hi > made.txt; echo done", timeout=5)
    assert result.exit_code == 0 and result.output == "done\n"
    assert await ws.read_file("made.txt") == "hi\n"


async def test_unsandboxed_run_ends_with_its_command_and_its_background_children(
    tmp_path: Path,
) -> None:
    ws = await opened(tmp_path, sandbox=False)
    result = await ws.run("sleep 60 & echo $! > child.pid; echo done", timeout=30)
    assert result.exit_code == 0 and not result.timed_out and result.output == "done\n"
    child = int((await ws.read_file("child.pid")).strip())
    for _ in range(1000):  # a SIGKILL lands when the child is next scheduled
        if not alive(child):
            break
        await asyncio.sleep(0.01)
    assert not alive(child)


async def test_unsandboxed_a_child_that_left_the_session_does_not_hold_the_run(
    tmp_path: Path,
) -> None:
    """A ``setsid`` child holds the output pipe after the command exits: the run waited for it
    until its timeout and reported the command as timed out, its exit code lost. (Unsandboxed,
    a child that leaves the session outlives the command: nothing hearth can track it by.)"""
    ws = await opened(tmp_path, sandbox=False)
    try:
        result = await ws.run(
            "setsid sleep 60 & echo $! > child.pid; echo started; exit 3", timeout=30
        )
        assert (result.exit_code, result.timed_out, result.output) == (3, False, "started\n")
    finally:
        with contextlib.suppress(Exception):
            os.kill(int((await ws.read_file("child.pid")).strip()), signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has not been reaped by its parent (gone already) but is no longer running.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


# The attacking command: for a while, swap the directory x of the workspace for a link to a
# host directory and back, as fast as it can.
SWAP = """python3 - <<'PY'
import os, time
end = time.time() + {seconds}
while time.time() < end:
    try:
        os.rename("x", "x.t"); os.symlink("{victim}", "x"); time.sleep(0.0005)
        os.unlink("x"); os.rename("x.t", "x"); time.sleep(0.0005)
    except OSError:
        pass
PY"""


@pytest.mark.skipif(not HAS_PYTHON, reason="needs Debian's python3 inside the sandbox")
async def test_a_parallel_command_cannot_make_root_hand_over_files_outside_the_workspace(
    tmp_path: Path, sandboxed: hearth.OpenWorkspace
) -> None:
    """As root, each ``run`` first gives the workspace's files to the sandbox's user. The walk
    went by path names: a command of a parallel call that swapped a listed directory for a link
    to a host directory had root change the owner of the host's files of the same names (all
    five, in a run with twelve parallel calls)."""
    if os.geteuid() != 0:
        pytest.skip("files are handed over only when hearth runs as root")
    victim = tmp_path / "victim"
    victim.mkdir()
    for i in range(5):
        (victim / f"secret{i}").write_text("root only\n")
    prep = "mkdir x && cd x && seq 1 20000 | sed s/^/f/ | xargs touch && touch secret0 secret1"
    assert (await sandboxed.run(prep + " secret2 secret3 secret4", timeout=60)).exit_code == 0
    attack = sandboxed.run(SWAP.format(seconds=10, victim=victim), timeout=30)
    await asyncio.gather(attack, *(sandboxed.run("true", timeout=30) for _ in range(10)))
    assert {p.name: p.stat().st_uid for p in victim.iterdir()} == {
        f"secret{i}": 0 for i in range(5)
    }
