"""The PostgreSQL server the benchmarks use: a throwaway cluster, or one you name with ``--pg``.

Without ``--pg``, a fresh cluster is made with the tests' helper (``tests/apps/pgcluster.py``:
``initdb`` into a temp dir, ``pg_ctl`` on a free loopback port, run as the ``postgres`` user when
root) but with PostgreSQL's default durability (``fsync=on``, ``synchronous_commit=on``,
``full_page_writes=on``), unlike the tests' ``fast`` cluster. It is removed afterwards.

With ``--pg postgresql://user@host:port/db``, that server is used as it is; each benchmark makes
its own ``bench_*`` schemas there and drops them at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import hearth

_PGCLUSTER = Path(__file__).resolve().parents[1] / "tests" / "apps" / "pgcluster.py"


def _pgcluster() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pgcluster", _PGCLUSTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pgcluster", module)
    spec.loader.exec_module(module)
    return module


async def serve_until_terminated(app: hearth.App) -> None:
    """A benchmark's child process: run ``app`` until SIGTERM, saying ``ready <owner>`` once it
    claims work."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with app.run() as rt:
        print(f"ready {rt.owner}", flush=True)
        await stop.wait()


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pg",
        metavar="URL",
        default=None,
        help="an existing PostgreSQL server (postgresql://user@host:port/db); default: a"
        " throwaway cluster with PostgreSQL's default settings (fsync on)",
    )


class Server:
    """One PostgreSQL server; ``url()`` names a fresh schema on it for ``hearth``."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.schemas: list[str] = []

    def url(self, schema: str | None = None) -> str:
        name = schema or f"bench_{uuid.uuid4().hex[:10]}"
        self.schemas.append(name)
        sep = "&" if "?" in self.conninfo else "?"
        return f"{self.conninfo}{sep}schema={name}"

    def connect(self, **kwargs: Any) -> Any:
        """A plain psycopg connection (autocommit) to the server."""
        import psycopg

        return psycopg.connect(self.conninfo, autocommit=True, **kwargs)

    def settings(self) -> str:
        """The durability settings in force, for the report."""
        names = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_sync_method",
        )
        with self.connect() as conn:
            shown = [f"{n}={conn.execute(f'SHOW {n}').fetchone()[0]}" for n in names]
        return " ".join(shown)

    def drop_schemas(self) -> None:
        if not self.schemas:
            return
        with self.connect() as conn:
            for name in self.schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        self.schemas.clear()


@contextlib.contextmanager
def server(url: str | None) -> Iterator[Server]:
    """The server ``--pg`` names, or a throwaway cluster with default durability."""
    if url is not None:
        found = Server(url)
        try:
            yield found
        finally:
            found.drop_schemas()
        return
    pgcluster = _pgcluster()
    bindir = pgcluster.server_bindir()
    if bindir is None:
        raise SystemExit(
            "no PostgreSQL server is installed: apt-get install postgresql, or --pg URL"
        )
    cluster = pgcluster.Cluster(bindir, fast=False)
    try:
        yield Server(cluster.conninfo)
    finally:
        cluster.destroy()
