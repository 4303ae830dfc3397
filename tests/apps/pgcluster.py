"""A throwaway PostgreSQL cluster for tests: ``initdb`` into a temporary folder, ``pg_ctl`` on a
free loopback port, stopped (and removed) afterwards.

Debian keeps the server's programs in ``/usr/lib/postgresql/<version>/bin``, off ``PATH``.
When the tests run as root, the server runs as the ``postgres`` user (it refuses root).
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path


def server_bindir() -> str | None:
    """Where ``initdb`` and ``pg_ctl`` are, or None when no PostgreSQL server is installed."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return str(Path(found[-1]).parent)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        bindir = out.stdout.strip()
        if bindir and Path(bindir, "initdb").exists():
            return bindir
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One running cluster; ``url(schema)`` names a fresh schema in its ``postgres`` database."""

    def __init__(self, bindir: str, *, fast: bool = True) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="hearth-pg-")
        self.data = os.path.join(self.dir, "data")
        self.fast = fast
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.start()

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        command = [os.path.join(self.bindir, tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done

    def _options(self) -> str:
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-c port={self.port}",
            f"-c unix_socket_directories={self.dir}",
            "-c max_connections=300",
        ]
        if self.fast:
            options += ["-c fsync=off", "-c full_page_writes=off"]
        return " ".join(options)

    @property
    def log(self) -> str:
        return os.path.join(self.dir, "server.log")

    def start(self) -> None:
        # -l: the server must not inherit our pipes, or waiting for pg_ctl's output never ends
        self._run("pg_ctl", "-D", self.data, "-o", self._options(), "-l", self.log, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self._run(*self._restart_args(mode))

    def _restart_args(self, mode: str) -> tuple[str, ...]:
        return (
            "pg_ctl",
            "-D",
            self.data,
            "-o",
            self._options(),
            "-l",
            self.log,
            "-m",
            mode,
            "-w",
            "restart",
        )

    def restart_command(self, mode: str = "fast") -> str:
        """``restart`` as one shell command (for a process that has only a command line)."""
        tool, *args = self._restart_args(mode)
        command = [os.path.join(self.bindir, tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return shlex.join(command)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def conninfo(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, schema: str | None = None) -> str:
        return f"{self.conninfo}?schema={schema or new_schema()}"

    def sql(self, statement: str) -> str:
        done = subprocess.run(
            ["psql", "-X", "-q", "-t", "-A", "-d", self.conninfo, "-c", statement],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr}")
        return done.stdout.strip()


def new_schema() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"
