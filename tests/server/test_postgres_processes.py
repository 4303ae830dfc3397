"""Several ``hearth serve`` processes on one PostgreSQL database, with real signals: fencing of a
frozen owner, takeover after SIGKILL, aborts and streams across processes, graceful release, and
a database restarted under load."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from httpharness import ServerProcess, sse_records, wait_until
from pgcluster import Cluster

from hearth.records import Record, SubmissionSettled, ToolOutcome, ToolStepSettled
from hearth.store import Store, Submission, open_store
from hearth.testing.invariants import assert_invariants

pytestmark = pytest.mark.crash

FAST_LEASES = {"HEARTH_LEASE_S": "2", "HEARTH_HEARTBEAT_S": "0.5", "HEARTH_SCAN_S": "0.5"}


class Fleet:
    """``hearth serve pgapp:app`` processes sharing one database (one fresh schema per test)."""

    def __init__(self, cluster: Cluster, tmp_path: Path) -> None:
        self.url = cluster.url()
        self.tmp_path = tmp_path
        self.tool_log = tmp_path / "tools.log"
        self.tool_log.touch()
        self.procs: list[ServerProcess] = []

    def start(self, tool_s: float = 30.0, **env: str) -> ServerProcess:
        settings = {"HEARTH_TEST_LOG": str(self.tool_log), "HEARTH_TEST_TOOL_S": str(tool_s)}
        proc = ServerProcess(
            self.url,
            app="pgapp:app",
            env={**settings, **env},
            log=self.tmp_path / f"server{len(self.procs)}.log",
        )
        self.procs.append(proc)
        return proc.start()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.proc is not None and proc.proc.poll() is None:
                os.kill(proc.proc.pid, signal.SIGCONT)
            proc.kill()

    def owner_of(self, pid: int) -> ServerProcess:
        return next(p for p in self.procs if p.proc is not None and p.proc.pid == pid)

    def ran(self) -> list[tuple[str, str, str, int]]:
        rows = [line.split("|") for line in self.tool_log.read_text().splitlines() if line]
        return [(what, conv, call, int(pid)) for what, conv, call, pid in rows]

    def wait_ran(self, what: str, timeout: float = 15.0) -> tuple[str, str, str, int]:
        wait_until(lambda: any(r[0] == what for r in self.ran()), timeout)
        return next(r for r in self.ran() if r[0] == what)

    def store_call(self, fn: Callable[[Store], Any]) -> Any:
        async def main() -> Any:
            store = open_store(self.url)
            await store.open()
            try:
                return await fn(store)
            finally:
                await store.close()

        return asyncio.run(main())

    def records(self, conversation_id: str) -> list[Record]:
        return list(self.store_call(lambda s: s.read(conversation_id)))

    def assert_invariants(self) -> None:
        """The shared checker over every conversation of the database (a zombie's late write
        would show as a record of a stale attempt)."""
        self.store_call(assert_invariants)

    def submission(self, sid: str) -> Submission:
        sub = self.store_call(lambda s: s.get_submission(sid))
        assert sub is not None
        return sub


@pytest.fixture
def fleet(pg_cluster: Cluster, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(pg_cluster, tmp_path)
    try:
        yield made
    finally:
        made.stop()


def post(proc: ServerProcess, agent: str, id: str, message: str, **extra: Any) -> httpx2.Response:
    return httpx2.post(
        f"{proc.url}/agents/{agent}/{id}", json={"message": message, **extra}, timeout=10.0
    )


def settled(proc: ServerProcess, agent: str, id: str, sid: str, wait: float = 20.0) -> Any:
    answer = httpx2.get(
        f"{proc.url}/agents/{agent}/{id}/submissions/{sid}",
        params={"wait": wait},
        timeout=wait + 10,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def settlements(records: list[Record]) -> Counter[str | None]:
    return Counter(r.submission_id for r in records if isinstance(r, SubmissionSettled))


def test_a_frozen_owner_writes_nothing_after_a_peer_took_its_work_over(fleet: Fleet) -> None:
    a = fleet.start(tool_s=4.0, **FAST_LEASES)
    b = fleet.start(tool_s=4.0, **FAST_LEASES)
    sid = post(a, "jobs", "c1", "charge it").json()["submission_id"]
    _, _, call_id, pid = fleet.wait_ran("charge-start")
    frozen = fleet.owner_of(pid)
    peer = b if frozen is a else a
    os.kill(pid, signal.SIGSTOP)
    try:
        done = settled(peer, "jobs", "c1", sid, wait=30)
        assert (done["status"], done["outcome"]) == ("settled", "completed")
    finally:
        os.kill(pid, signal.SIGCONT)
    # Woken past its lease, the frozen process learns it lost the claim (its heartbeat, or its
    # late tool result refused) and stops the attempt.
    wait_until(
        lambda: (
            "lost the lease" in frozen.log.read_text()
            or "taken over by another owner" in frozen.log.read_text()
        ),
        15,
    )
    time.sleep(4.5)  # past the tool's own end: any late write it might still try
    records = fleet.records("jobs/c1")
    taken_over = next(r.offset for r in records if r.attempt == 2)
    foreign = [r for r in records if r.attempt == 1 and r.offset > taken_over]
    assert foreign == []
    [outcome] = [r for r in records if isinstance(r, ToolOutcome) and r.tool_call_id == call_id]
    assert outcome.is_error and outcome.content["type"] == "interrupted"
    assert settlements(records) == {sid: 1}
    assert [r[0] for r in fleet.ran()].count("charge-start") == 1
    fleet.assert_invariants()


def test_a_peer_settles_the_work_of_a_killed_owner_without_rerunning_its_calls(
    fleet: Fleet,
) -> None:
    a = fleet.start(tool_s=3.0, **FAST_LEASES)
    b = fleet.start(tool_s=3.0, **FAST_LEASES)
    sid = post(a, "jobs", "c2", "both now").json()["submission_id"]
    fleet.wait_ran("charge-start")
    pid = fleet.wait_ran("step-one")[3]
    # Kill once step one's record is on disk: before that, running it again would be right.
    wait_until(lambda: any(isinstance(r, ToolStepSettled) for r in fleet.records("jobs/c2")), 10)
    killed = fleet.owner_of(pid)
    peer = b if killed is a else a
    killed.kill()
    started = time.monotonic()
    done = settled(peer, "jobs", "c2", sid, wait=30)
    took = time.monotonic() - started
    assert (done["status"], done["outcome"], done["reply"]) == ("settled", "completed", "all done")
    assert took < 20, f"the takeover took {took:.1f} s"
    records = fleet.records("jobs/c2")
    outcomes = {r.name: r for r in records if isinstance(r, ToolOutcome)}
    assert outcomes["charge"].content["type"] == "interrupted"  # ordinary: not run again
    assert outcomes["provision"].content == "one+two"  # durable: re-executed
    steps = Counter(r.step for r in records if isinstance(r, ToolStepSettled))
    assert steps == {"one": 1, "two": 1}
    ran = Counter(r[0] for r in fleet.ran())
    assert (ran["charge-start"], ran["step-one"], ran["step-two"]) == (1, 1, 1)
    assert settlements(records) == {sid: 1}
    assert fleet.submission(sid).attempt == 2
    fleet.assert_invariants()


def test_an_abort_posted_to_one_process_stops_work_running_in_another(fleet: Fleet) -> None:
    a = fleet.start()
    b = fleet.start()
    sid = post(a, "staller", "c3", "wait forever").json()["submission_id"]
    wait_until(lambda: fleet.submission(sid).status == "running", 10)
    owner = fleet.submission(sid).lease_owner or ""
    runner = next(p for p in (a, b) if p.proc is not None and f":{p.proc.pid}:" in owner)
    other = b if runner is a else a
    answer = httpx2.post(f"{other.url}/agents/staller/c3/abort", timeout=10)
    assert answer.json()["aborted"] is True
    done = settled(other, "staller", "c3", sid, wait=10)
    assert (done["status"], done["outcome"]) == ("settled", "aborted")
    assert runner.proc is not None and runner.proc.poll() is None


def test_a_stream_on_one_process_sees_what_another_appends(fleet: Fleet) -> None:
    a = fleet.start()
    sid = post(a, "jobs", "c4", "chatty please").json()["submission_id"]
    wait_until(lambda: fleet.submission(sid).status == "running", 10)
    b = fleet.start()  # started after a claimed the work: every record comes from a
    seen: list[dict[str, Any]] = []
    with httpx2.stream(
        "GET",
        f"{b.url}/agents/jobs/c4/stream",
        headers={"Accept": "text/event-stream"},
        timeout=30,
    ) as response:
        for _, record in sse_records(response):
            seen.append(record)
            if record["type"] == "submission_settled":
                break
    deltas = [r for r in seen if r["type"] == "assistant_text_delta"]
    assert deltas, "no live text arrived through the other process"
    assert [r["offset"] for r in seen] == list(range(len(seen)))
    assert settled(b, "jobs", "c4", sid, wait=5)["outcome"] == "completed"


def test_a_graceful_stop_lets_a_peer_claim_at_once(fleet: Fleet) -> None:
    a = fleet.start(tool_s=3.0, HEARTH_LEASE_S="60", HEARTH_HEARTBEAT_S="5", HEARTH_SCAN_S="60")
    sid = post(a, "jobs", "c5", "provision it").json()["submission_id"]
    fleet.wait_ran("step-one")
    b = fleet.start(tool_s=3.0, HEARTH_LEASE_S="60", HEARTH_HEARTBEAT_S="5", HEARTH_SCAN_S="60")
    a.terminate()
    assert a.wait(30) == 0
    started = time.monotonic()
    done = settled(b, "jobs", "c5", sid, wait=30)
    assert done["outcome"] == "completed"
    assert time.monotonic() - started < 15  # not the 60 s lease, nor the 60 s scan
    steps = Counter(r.step for r in fleet.records("jobs/c5") if isinstance(r, ToolStepSettled))
    assert steps == {"one": 1, "two": 1}


def _load(fleet: Fleet, procs: list[ServerProcess], count: int, fault: Callable[[], None]) -> None:
    """Admit ``count`` messages round-robin (retrying 503s with the same key) while ``fault``
    strikes mid-run; every one settles exactly once and no answer is a 500."""
    receipts: dict[str, str] = {}
    statuses: Counter[int] = Counter()

    def admit(n: int) -> None:
        proc = procs[n % len(procs)]
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                answer = post(proc, "jobs", f"load-{n % 40}", f"hello {n}", idempotency_key=f"k{n}")
            except httpx2.TransportError:
                time.sleep(0.1)
                continue
            statuses[answer.status_code] += 1
            if answer.status_code == 202:
                receipts[answer.json()["submission_id"]] = f"load-{n % 40}"
                return
            assert answer.status_code == 503, answer.text
            assert answer.headers.get("Retry-After")
            time.sleep(0.2)
        raise AssertionError(f"message {n} was never admitted")

    def admit_all(first: int, last: int) -> None:
        for n in range(first, last):
            admit(n)

    threads = [
        threading.Thread(target=admit_all, args=(i * count // 4, (i + 1) * count // 4))
        for i in range(4)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: len(receipts) >= count // 3, 60)
    fault()
    for t in threads:
        t.join(90)
    assert len(receipts) == count, statuses
    assert statuses[500] == 0

    def all_settled() -> bool:
        subs = fleet.store_call(lambda s: s.list_submissions(limit=count + 10))
        return len(subs) == count and all(s.outcome is not None for s in subs)

    wait_until(all_settled, 90, step=0.5)
    for conv in sorted(set(receipts.values())):
        records = fleet.records(f"jobs/{conv}")
        counted = settlements(records)
        assert set(counted.values()) == {1}, conv
    subs = fleet.store_call(lambda s: s.list_submissions(limit=count + 10))
    assert {s.outcome for s in subs} == {"completed"}
    for proc in procs:  # both recovered without a restart of their own
        assert proc.proc is not None and proc.proc.poll() is None
        sid = post(proc, "jobs", "after", "still there?").json()["submission_id"]
        assert settled(proc, "jobs", "after", sid)["outcome"] == "completed"
    fleet.assert_invariants()


def test_a_database_restart_mid_run_loses_nothing_and_settles_everything_once(
    fleet: Fleet, pg_cluster: Cluster
) -> None:
    procs = [fleet.start(**FAST_LEASES), fleet.start(**FAST_LEASES)]

    def restart() -> None:
        pg_cluster.restart("fast")

    _load(fleet, procs, 200, restart)


def test_terminating_every_hearth_connection_mid_run_loses_nothing(
    fleet: Fleet, pg_cluster: Cluster
) -> None:
    procs = [fleet.start(**FAST_LEASES), fleet.start(**FAST_LEASES)]

    def terminate_all() -> None:
        pg_cluster.sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )

    _load(fleet, procs, 120, terminate_all)


def test_one_process_on_postgres_answers_a_message(fleet: Fleet) -> None:
    a = fleet.start()
    sid = post(a, "jobs", "c6", "hi").json()["submission_id"]
    assert settled(a, "jobs", "c6", sid)["reply"] == "echo: hi"
    assert [r.type for r in fleet.records("jobs/c6")][-1] == "submission_settled"
