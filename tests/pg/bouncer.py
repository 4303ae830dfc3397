"""A throwaway pgbouncer (Debian's ``pgbouncer`` package) in front of a test cluster: run as
``postgres`` when the tests run as root (pgbouncer refuses root), on a free loopback port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from pgcluster import Cluster, free_port


def program() -> str | None:
    """Where pgbouncer is (Debian puts it in /usr/sbin, off a user's PATH), or None."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


class PgBouncer:
    """One pgbouncer process: ``mode`` is its ``pool_mode``; ``ignore`` its
    ``ignore_startup_parameters``."""

    def __init__(self, program: str, cluster: Cluster, mode: str, ignore: str) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="hearth-pgb-")
        users = Path(self.dir, "users.txt")
        users.write_text('"postgres" ""\n')
        config = Path(self.dir, "pgbouncer.ini")
        config.write_text(
            f"[databases]\n* = host=127.0.0.1 port={cluster.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n"
            "max_client_conn = 100\ndefault_pool_size = 10\n"
            f"logfile = {self.dir}/pgbouncer.log\npidfile = {self.dir}/pgbouncer.pid\n"
            + (f"ignore_startup_parameters = {ignore}\n" if ignore else "")
        )
        command = [program, "-d", str(config)]
        if os.geteuid() == 0:
            for path in (self.dir, users, config):
                shutil.chown(path, "postgres", "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, text=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start: {self.log()}") from None
                time.sleep(0.05)

    @property
    def conninfo(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def log(self) -> str:
        try:
            return Path(self.dir, "pgbouncer.log").read_text()
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            pid = int(Path(self.dir, "pgbouncer.pid").read_text())
        except (OSError, ValueError):
            pid = None
        if pid is not None:
            try:
                os.kill(pid, 15)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.05)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
