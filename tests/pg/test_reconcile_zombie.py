"""A zombie owner and a reconciled re-run on PostgreSQL, with real signals: the owner running an
ordinary call is frozen (SIGSTOP) past its lease; a peer takes the work over, its reconcile finds
no effect in the ledger (NotDone) and runs the call again with the same tool call id. Woken
(SIGCONT), the zombie's worker thread sends its late request: the ledger refuses it (insert if
absent), its outcome is fenced out — one outcome and exactly one effect per call."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pgcluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

import httpx2
from httpharness import ServerProcess, wait_until

from hearth.records import Record, SubmissionSettled, ToolOutcome
from hearth.store import open_store
from hearth.testing import Ledger
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


def test_a_zombies_late_effect_after_a_reconciled_re_run_is_refused(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    url = pg_cluster.url()
    ledger = Ledger(tmp_path / "ledger")
    tool_log = tmp_path / "tools.log"
    paths = [
        str(HERE.parent / "apps"),
        str(HERE.parent / "server"),
        os.environ.get("PYTHONPATH", ""),
    ]
    common = {
        "LEDGER_DIR": str(ledger.path),
        "HEARTH_TEST_LOG": str(tool_log),
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        **FAST_LEASES,
    }
    a = ServerProcess(
        url, app="reconcileapp:app", env={**common, "PAY_S": "3"}, log=tmp_path / "a.log"
    )
    b = ServerProcess(
        url, app="reconcileapp:app", env={**common, "PAY_S": "0"}, log=tmp_path / "b.log"
    )
    try:
        a.start()
        answer = httpx2.post(f"{a.url}/agents/payer/z1", json={"message": "pay_sync"}, timeout=10)
        assert answer.status_code == 202, answer.text
        sid = answer.json()["submission_id"]
        wait_until(lambda: any(line[0] == "pay_sync" for line in log_lines(tool_log)), 15)
        call_id = log_lines(tool_log)[0][2]
        assert a.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)  # frozen mid-call, before its effect
        try:
            b.start()
            done = httpx2.get(
                f"{b.url}/agents/payer/z1/submissions/{sid}", params={"wait": 30}, timeout=40
            ).json()
            assert (done["status"], done["outcome"]) == ("settled", "completed")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        # Woken, the zombie's thread sends its late request; then the attempt learns it lost.
        wait_until(lambda: len(ledger.requests(call_id)) == 2, 15)
        wait_until(
            lambda: (
                "lost the lease" in a.log.read_text()
                or "taken over by another owner" in a.log.read_text()
            ),
            15,
        )
        time.sleep(1.0)  # any late write it might still try
        assert b.proc is not None
        assert ledger.requests(call_id) == [
            (call_id, True, b.proc.pid),
            (call_id, False, a.proc.pid),
        ]
        assert ledger.entries() == {call_id: {"paid": 5}}  # exactly one effect
        records: list[Record] = store_call(url, lambda s: s.read("payer/z1"))
        outcomes = [r for r in records if isinstance(r, ToolOutcome)]
        assert [(o.tool_call_id, o.reconciled, o.attempt) for o in outcomes] == [
            (call_id, "not_done", 2)
        ]
        assert [r.outcome for r in records if isinstance(r, SubmissionSettled)] == ["completed"]
        store_call(url, assert_invariants)
    finally:
        for proc in (a, b):
            if proc.proc is not None and proc.proc.poll() is None:
                os.kill(proc.proc.pid, signal.SIGCONT)
            proc.kill()
