"""A zombie inside ``step.transaction`` (PostgreSQL, real signals): the owner is frozen (SIGSTOP)
after its function wrote a row, inside the open transaction. The server ends that transaction
(it sits idle past ``idle_in_transaction_session_timeout``), a peer takes the work over and books
the row itself; woken (SIGCONT), the zombie commits nothing: the row is there once, with one
step record, written by the peer's attempt."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pgcluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

import httpx2
from httpharness import ServerProcess, wait_until

from hearth.records import Record, ToolOutcome, ToolStepSettled
from hearth.store import open_store
from hearth.testing.invariants import assert_invariants
from hearth.testing.toollog import log_lines

pytestmark = pytest.mark.crash

HERE = Path(__file__).resolve().parent
FAST_LEASES = {"HEARTH_LEASE_S": "2", "HEARTH_HEARTBEAT_S": "0.5", "HEARTH_SCAN_S": "0.5"}


def store_call(url: str, fn: Any) -> Any:
    async def main() -> Any:
        store = open_store(url)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(main())


def test_a_frozen_owner_inside_a_transaction_commits_nothing(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    url = pg_cluster.url()
    table = f"bookings_{uuid.uuid4().hex[:10]}"
    pg_cluster.sql(f"CREATE TABLE public.{table} (tool_call_id text, step text, n int)")
    tool_log = tmp_path / "tools.log"
    paths = [
        str(HERE.parent / "apps"),
        str(HERE.parent / "server"),
        os.environ.get("PYTHONPATH", ""),
    ]
    common = {
        "TX_TABLE": table,
        "HEARTH_TEST_LOG": str(tool_log),
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        **FAST_LEASES,
    }
    a = ServerProcess(url, app="txapp:app", env={**common, "TX_SLEEP": "5"}, log=tmp_path / "a.log")
    b = ServerProcess(url, app="txapp:app", env={**common, "TX_SLEEP": "0"}, log=tmp_path / "b.log")
    try:
        a.start()
        answer = httpx2.post(f"{a.url}/agents/booker/z1", json={"message": "slow"}, timeout=10)
        assert answer.status_code == 202, answer.text
        sid = answer.json()["submission_id"]
        wait_until(lambda: any(x[0] == "slow-in-transaction" for x in log_lines(tool_log)), 15)
        assert a.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)  # its row is written, its transaction open
        try:
            b.start()
            done = httpx2.get(
                f"{b.url}/agents/booker/z1/submissions/{sid}", params={"wait": 60}, timeout=70
            ).json()
            assert (done["status"], done["outcome"]) == ("settled", "completed")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        wait_until(
            lambda: (
                "lost the lease" in a.log.read_text()
                or "taken over by another owner" in a.log.read_text()
            ),
            20,
        )
        time.sleep(6.0)  # past the zombie's own linger: any late commit it might still try
        rows = pg_cluster.sql(f"SELECT tool_call_id, step FROM public.{table}").splitlines()
        assert len(rows) == 1, rows
        records: list[Record] = store_call(url, lambda s: s.read("booker/z1"))
        steps = [r for r in records if isinstance(r, ToolStepSettled)]
        assert [(s.step, s.value, s.attempt) for s in steps] == [("first", 1, 2)]
        assert rows[0] == f"booker/z1:{steps[0].tool_call_id}|first"
        [outcome] = [r for r in records if isinstance(r, ToolOutcome)]
        assert (outcome.is_error, outcome.content, outcome.attempt) == (False, 1, 2)
        store_call(url, assert_invariants)
    finally:
        for proc in (a, b):
            if proc.proc is not None and proc.proc.poll() is None:
                os.kill(proc.proc.pid, signal.SIGCONT)
            proc.kill()
