"""Channels and schedules across real processes: two ``hearth serve`` replicas on one PostgreSQL
database admit each occurrence and each delivery once; on SQLite, a process SIGKILLed while it
fires an occurrence neither loses nor doubles it after a restart."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import inputsapp
import pytest
from httpharness import ServerProcess, wait_until
from pgcluster import Cluster

from hearth.channels import sign
from hearth.schedules import iso
from hearth.testing.clock import FileClock

pytestmark = pytest.mark.crash

T0 = 1_800_000_000.0  # a whole minute


def scheduled_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "HEARTH_TEST_SCHEDULES": "1",
        "HEARTH_TEST_CLOCK": str(tmp_path / "clock"),
        "HEARTH_TEST_LOG": str(tmp_path / "receive.log"),
        **extra,
    }


def ticks(proc: ServerProcess) -> list[dict[str, Any]]:
    answer = httpx2.get(f"{proc.url}/agents/triage/ticks", timeout=10)
    return [] if answer.status_code == 404 else list(answer.json()["submissions"])


def occurrences(proc: ServerProcess) -> list[str]:
    return [s["payload"]["scheduled_for"] for s in ticks(proc)]


def deliver(proc: ServerProcess, delivery_id: str, body: dict[str, Any]) -> httpx2.Response:
    raw = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Delivery-Id": delivery_id,
        "X-Signature": sign(inputsapp.SECRET, raw),
    }
    return httpx2.post(f"{proc.url}/channels/hooks", content=raw, headers=headers, timeout=10)


def test_two_replicas_admit_every_occurrence_and_every_delivery_once(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    clock = FileClock(str(tmp_path / "clock"))
    clock.set(T0 + 30)
    url = pg_cluster.url()
    env = scheduled_env(tmp_path)
    procs = [
        ServerProcess(url, app="inputsapp:app", env=env, log=tmp_path / f"server{n}.log")
        for n in range(2)
    ]
    try:
        for proc in procs:
            proc.start()
        a, b = procs
        # 24 occurrences, one minute of the injected clock at a time: both replicas wake for
        # each one within 50 ms of the other.
        for minute in range(1, 25):
            clock.set(T0 + 60 * minute + 1)
            wait_until(lambda n=minute: len(ticks(a)) >= n, 10)
        assert occurrences(b) == [iso(T0 + 60 * m) for m in range(1, 25)]
        # The same webhook delivered to both at once admits once, and they agree on it.
        for n in range(10):
            body = {"to": [{"id": f"w{n}", "message": "x"}, {"id": "shared", "message": f"{n}"}]}
            with ThreadPoolExecutor(2) as pool:
                answers = list(pool.map(deliver, procs, [f"d-{n}"] * 2, [body] * 2))
            assert [r.status_code for r in answers] == [202, 202]
            results = [r.json() for r in answers]
            assert sorted(r["deduplicated"] for r in results) == [False, True]
            assert results[0]["submission_ids"] == results[1]["submission_ids"]
        shared = httpx2.get(f"{a.url}/agents/triage/shared", timeout=10).json()["submissions"]
        assert Counter(s["source"]["delivery_id"] for s in shared) == {
            f"d-{n}": 1 for n in range(10)
        }
        listed = httpx2.get(f"{b.url}/channels/hooks/deliveries?limit=100", timeout=10).json()
        assert len(listed["deliveries"]) == 10
        assert {d["status"] for d in listed["deliveries"]} == {"admitted"}
    finally:
        for proc in procs:
            proc.kill()


@pytest.mark.parametrize(
    "crash_at",
    [
        "before:store.admit_occurrence",
        "before:store.admit_occurrence>store:commit-begin",
        "before:store.admit_occurrence>store:commit-done",
    ],
    ids=["before-the-admission", "before-its-commit", "after-its-commit"],
)
def test_a_kill_while_firing_neither_loses_nor_doubles_the_occurrence(
    tmp_path: Path, crash_at: str
) -> None:
    clock = FileClock(str(tmp_path / "clock"))
    clock.set(T0 + 30)
    db = tmp_path / "hearth.db"
    doomed = ServerProcess(
        db, app="inputsapp:app", env=scheduled_env(tmp_path, HEARTH_CRASH_AT=crash_at)
    ).start()
    clock.set(T0 + 61)  # the first occurrence is due: the process dies firing it
    assert doomed.wait(15) == -9
    again = ServerProcess(db, doomed.port, app="inputsapp:app", env=scheduled_env(tmp_path))
    try:
        again.start()
        wait_until(lambda: len(ticks(again)) >= 1, 10)
        clock.set(T0 + 121)
        wait_until(lambda: len(ticks(again)) >= 2, 10)
        assert occurrences(again) == [iso(T0 + 60), iso(T0 + 120)]
    finally:
        again.kill()


def test_a_delivery_committed_just_before_a_kill_is_answered_deduplicated_on_retry(
    tmp_path: Path,
) -> None:
    db = tmp_path / "hearth.db"
    crash = "before:store.admit_delivery>store:commit-done"
    doomed = ServerProcess(
        db, app="inputsapp:app", env=scheduled_env(tmp_path, HEARTH_CRASH_AT=crash)
    ).start()
    body = {"to": [{"id": "k", "message": "once"}]}
    with pytest.raises(httpx2.TransportError):  # the sender never heard its 202
        deliver(doomed, "k-1", body)
    assert doomed.wait(15) == -9
    again = ServerProcess(db, doomed.port, app="inputsapp:app", env=scheduled_env(tmp_path))
    try:
        again.start()
        retried = deliver(again, "k-1", body)  # the sender retries
        assert retried.status_code == 202 and retried.json()["deduplicated"] is True
        subs = httpx2.get(f"{again.url}/agents/triage/k", timeout=10).json()["submissions"]
        assert [s["id"] for s in subs] == retried.json()["submission_ids"]
        log = (tmp_path / "receive.log").read_text().splitlines()
        assert len(log) == 1  # routed once, before the kill; never again
    finally:
        again.kill()
