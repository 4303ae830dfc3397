"""A disk that fails with EIO under a running ``hearth serve`` on SQLite.

The server runs with ``tests/apps/eioshim.c`` preloaded: while a switch file exists, every
write, ``fsync`` and ``fdatasync`` on a file in the database's folder fails with EIO. The server
must answer 503 with a plain error (no 500, no traceback), stop its running work without settling
it, and carry on by itself once the disk works again, losing nothing it acknowledged.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
import pytest
from faultkit import FAST_LEASES, acks, on_store, serve
from httpharness import ServerProcess, wait_until

from hearth.records import Record, SubmissionSettled, ToolStepSettled
from hearth.testing.invariants import ToolLog, assert_invariants
from hearth.testing.toollog import tool_runs

pytestmark = pytest.mark.crash


def post(server: ServerProcess, agent: str, conv: str, message: str, **extra: Any) -> Any:
    return httpx2.post(
        f"{server.url}/agents/{agent}/{conv}", json={"message": message, **extra}, timeout=15
    )


def settled(server: ServerProcess, agent: str, conv: str, sid: str, wait: float = 30) -> Any:
    answer = httpx2.get(
        f"{server.url}/agents/{agent}/{conv}/submissions/{sid}",
        params={"wait": wait},
        timeout=wait + 10,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("only_sync", [False, True], ids=["writes-fail", "fsync-fails"])
def test_an_io_error_pauses_the_server_and_it_recovers_by_itself(
    tmp_path: Path, eio_shim: Path, only_sync: bool
) -> None:
    folder = tmp_path / "db"
    folder.mkdir()
    switch = tmp_path / "eio-on"
    tool_log, ack_log = tmp_path / "tools.log", tmp_path / "acks.log"
    env = {
        **FAST_LEASES,
        "LD_PRELOAD": str(eio_shim),
        "EIO_SWITCH": str(switch),
        "EIO_PREFIX": str(folder),
        "HEARTH_TEST_LOG": str(tool_log),
        "HEARTH_TEST_ACKS": str(ack_log),
        "HEARTH_TEST_STEPS": "10",
        "HEARTH_TEST_STEP_S": "0.3",
    }
    if only_sync:
        env["EIO_ONLY_SYNC"] = "1"
    server = serve(folder / "h.db", tmp_path / "s.log", **env)
    server.start()
    try:
        admitted: dict[str, str] = {}  # submission id → conversation, for every 202
        for n in range(5):
            answer = post(server, "echo", f"e{n}", f"hello {n}")
            assert answer.status_code == 202, answer.text
            admitted[answer.json()["submission_id"]] = f"e{n}"
        job = post(server, "worker", "w1", "chores please")
        assert job.status_code == 202, job.text
        job_id = job.json()["submission_id"]
        wait_until(lambda: len(acks(ack_log)) >= 2, 15)

        switch.touch()  # the disk fails from here on
        refused = post(server, "echo", "e-during", "are you there?", idempotency_key="during")
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("Retry-After")
        body = refused.json()
        assert "disk refused a write" in str(body), body
        assert "Traceback" not in refused.text
        time.sleep(1.0)  # a step already committed may still be writing its line
        before = len(acks(ack_log))
        time.sleep(2.5)  # several steps' worth of time, and past a lease
        assert len(acks(ack_log)) == before, "a step was acknowledged while the disk failed"
        view = settled(server, "worker", "w1", job_id, wait=0)  # reads still work
        assert view["outcome"] is None, view
        assert server.proc is not None and server.proc.poll() is None

        switch.unlink()  # the disk works again: no restart
        retried = post(server, "echo", "e-during", "are you there?", idempotency_key="during")
        assert retried.status_code == 202, retried.text
        admitted[retried.json()["submission_id"]] = "e-during"
        done = settled(server, "worker", "w1", job_id, wait=60)
        assert (done["outcome"], done["reply"]) == ("completed", "job done"), done
        for sid, conv in admitted.items():
            assert settled(server, "echo", conv, sid)["outcome"] == "completed"
        server.terminate()
        assert server.wait(30) == 0
    finally:
        server.kill()

    steps_acked = {a[3] for a in acks(ack_log) if a[0] == "step"}
    assert len(steps_acked) == 10

    async def check(store: Any) -> list[Record]:
        await assert_invariants(store, tool_log=ToolLog(tool_runs(tool_log)))
        return list(await store.read("worker/w1"))

    records = on_store(server.db_url, check)
    steps = Counter(r.step for r in records if isinstance(r, ToolStepSettled))
    assert steps == Counter({f"s{n}": 1 for n in range(10)})
    assert sum(isinstance(r, SubmissionSettled) for r in records) == 1
