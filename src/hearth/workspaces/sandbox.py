"""Running a ``run`` command: inside bubblewrap, or (opted out) as a plain child process.

Inside bubblewrap the command sees the system read-only (``/usr`` and a few files of ``/etc``),
the workspace read-write at ``/workspace`` (its working directory), an empty ``/tmp``, and no
network: every namespace is unshared. It dies with hearth and is killed at its timeout.

Limits on memory, processes and file size are set with ``prlimit`` around the command, inside
the sandbox. The kernel does not count processes against a limit for uid 0, so when hearth runs
as root the sandbox runs the command as an unprivileged user (``SANDBOX_UID``, ``nobody``) and
hands the workspace's files to that user first; otherwise the command runs as hearth's own user
in a user namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile

from hearth.errors import SandboxUnavailable
from hearth.workspaces.base import RunLimits, RunResult

SANDBOX_UID = 65534  # nobody
INSIDE = "/workspace"
_PATH = "/usr/local/bin:/usr/bin:/bin"
# The parts of /etc a shell and common tools need; nothing secret.
_ETC = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "passwd",
    "group",
)


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def sandbox_argv(bwrap: str, directory: str, command: str, limits: RunLimits) -> list[str]:
    """The bubblewrap command line that runs ``command`` with ``directory`` as the workspace."""
    argv = [bwrap, "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:
        # No user namespace: the command drops to an unprivileged uid (setpriv below), so
        # the process limit binds.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        argv += ["--unshare-cgroup-try"]
    else:
        argv += ["--unshare-all", "--unshare-user"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        path = f"/{top}"
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    # Made by bwrap as root it would be 0700, and closed to the command's unprivileged uid
    # (no user name, no /etc/alternatives: awk and the other alternatives would not start).
    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in _ETC:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    argv += ["--bind", directory, INSIDE, "--chdir", INSIDE]
    argv += ["--clearenv", "--setenv", "PATH", _PATH, "--setenv", "HOME", INSIDE]
    argv += ["--setenv", "LANG", "C.UTF-8", "--"]
    if os.geteuid() == 0:
        argv += [
            "setpriv",
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    return argv + _limited(command, limits)


def plain_argv(command: str, limits: RunLimits) -> list[str]:
    """The command line of an unsandboxed run (the app opted out): limits only."""
    return _limited(command, limits)


def _limited(command: str, limits: RunLimits) -> list[str]:
    return [
        "prlimit",
        f"--as={limits.memory_bytes}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_bytes}",
        "--",
        "/bin/sh",
        "-c",
        command,
    ]


_SANDBOX_WORKS: dict[tuple[str, int], str] = {}  # (bwrap, euid) → "" or why it cannot


async def _check_sandbox(bwrap: str, limits: RunLimits) -> None:
    """Refuse clearly, once per process, where bubblewrap is installed but cannot make a sandbox
    (a container without the privileges or user namespaces it needs): otherwise its complaint
    would look like the command's own output."""
    key = (bwrap, os.geteuid())
    if key not in _SANDBOX_WORKS:
        with tempfile.TemporaryDirectory(prefix="hearth-sandbox-check-") as directory:
            if os.geteuid() == 0:
                os.chown(directory, SANDBOX_UID, SANDBOX_UID)
            proc = await asyncio.create_subprocess_exec(
                *sandbox_argv(bwrap, directory, "true", limits),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await proc.communicate()
        why = out.decode("utf-8", errors="replace").strip() or f"exit code {proc.returncode}"
        _SANDBOX_WORKS[key] = "" if proc.returncode == 0 else why
    why = _SANDBOX_WORKS[key]
    if why:
        raise SandboxUnavailable(
            f"run is refused: bubblewrap cannot make a sandbox here ({why}); give hearth the "
            "privileges it needs (or user namespaces), or let the app opt out with sandbox=False"
        )


OUTPUT_GRACE_S = 1.0  # how long output is read after the command exits, for its last bytes


def _kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def hand_over(directory: str) -> None:
    """Give the workspace's files to the sandbox's user (hearth runs as root).

    GNU ``chown -R`` does it: it walks without recursion (a command may nest directories
    thousands deep) and changes each entry through its parent's descriptor without following
    links, so a command of a parallel call that swaps a directory for a link to somewhere else
    meanwhile cannot make root change the owner of anything outside the workspace (a walk by
    path names could be led out so). What it cannot change (an entry gone meanwhile) stays."""
    owner = f"{SANDBOX_UID}:{SANDBOX_UID}"
    subprocess.run(
        ["chown", "-R", "-P", "-h", owner, "--", directory],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


async def run_command(
    directory: str, command: str, timeout: float, limits: RunLimits, *, sandbox: bool
) -> RunResult:
    """Run ``command`` in ``directory``; kill it at ``timeout`` seconds."""
    if not isinstance(command, str) or not command.strip():
        raise ValueError("command must be a non-empty shell command line")
    timeout = min(float(timeout), limits.max_timeout)
    if timeout <= 0:
        raise ValueError("timeout must be a positive number of seconds")
    if sandbox:
        bwrap = bwrap_path()
        if bwrap is None:
            raise SandboxUnavailable(
                "run is refused: bubblewrap (bwrap) is not installed, so the command cannot be "
                "sandboxed; install Debian's bubblewrap, or let the app opt out with "
                "sandbox=False"
            )
        await _check_sandbox(bwrap, limits)
        if os.geteuid() == 0:
            await asyncio.to_thread(hand_over, directory)
        argv = sandbox_argv(bwrap, directory, command, limits)
    else:
        argv = plain_argv(command, limits)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=directory,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    kept = bytearray()
    cut = 0

    async def collect() -> None:
        nonlocal cut
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            room = limits.output_bytes - len(kept)
            kept.extend(chunk[:room])
            cut += max(0, len(chunk) - max(room, 0))

    async def finish() -> None:
        reading = asyncio.ensure_future(collect())
        try:
            # Until the output ends or the command exits (``proc.wait`` would also wait for the
            # pipe, which a background child may hold open).
            while proc.returncode is None and not reading.done():
                await asyncio.wait({reading}, timeout=0.05)
            # What the command left running in the background ends with it (inside bubblewrap
            # its pid namespace is gone already), so the output pipe closes.
            _kill_session(proc.pid)
            # Unsandboxed, a child that left the session (setsid) may hold the pipe open for
            # ever: what came within a moment is the output, and the command's exit stands.
            await asyncio.wait({reading}, timeout=OUTPUT_GRACE_S)
            await proc.wait()
        finally:
            reading.cancel()
            # The pipe an escaped child still holds: closed on this side, not left to the
            # garbage collector (asyncio's Process keeps its transport private).
            transport = getattr(proc, "_transport", None)
            if transport is not None and proc.returncode is not None:
                transport.close()

    timed_out = False
    try:
        async with asyncio.timeout(timeout):
            await finish()
    except TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:
            # The whole session: the command and whatever it started (outside bwrap too).
            _kill_session(proc.pid)
            await proc.wait()
    output = kept.decode("utf-8", errors="replace")
    if timed_out:
        return RunResult(None, output, cut, timed_out=True)
    return RunResult(proc.returncode, output, cut)
