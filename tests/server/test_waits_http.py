"""Durable waits over HTTP, the SDK and the CLI, and across real processes: SIGKILL while
waiting, a resolve written while no process runs, a timeout that passed while none ran, and
the same on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import waitapp
from earlyapp import EarlyWaits
from httpharness import HERE, SRC, ServerProcess, ThreadServer, wait_until
from pgcluster import Cluster

import hearth
from hearth.records import WaitResolved
from hearth.testing import ScriptedModel, call, calls
from hearth.testing.crash import with_store
from hearth.testing.invariants import assert_invariants

APPS = HERE.parent / "apps"


@pytest.fixture
def wait_server(tmp_path: Path) -> Iterator[ThreadServer]:
    app = hearth.App(waitapp.AGENTS, db=str(tmp_path / "h.db"), providers=waitapp.MODELS, port=0)
    server = ThreadServer(app).start()
    yield server
    server.stop()


def pending(http: httpx2.Client, count: int = 1) -> list[dict[str, Any]]:
    """The pending waits, once there are ``count`` of them."""
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        nonlocal found
        found = http.get("/waits").json()["waits"]
        return len(found) >= count

    wait_until(enough, timeout=20)
    return found


def settled(http: httpx2.Client, conversation: str, sid: str) -> dict[str, Any]:
    answer: dict[str, Any] = http.get(
        f"/agents/{conversation}/submissions/{sid}", params={"wait": 20}, timeout=30
    ).json()
    return answer


def test_the_wait_routes_answer_as_documented(wait_server: ThreadServer) -> None:
    with wait_server.client() as http:
        sid = http.post("/agents/cashier/c-1", json={"message": "refund 250"}).json()[
            "submission_id"
        ]
        [wait] = pending(http)
        assert {
            k: wait[k] for k in ("agent", "id", "conversation_id", "submission_id", "name")
        } == {
            "agent": "cashier",
            "id": "c-1",
            "conversation_id": "cashier/c-1",
            "submission_id": sid,
            "name": "approval",
        }
        assert wait["prompt"] == "Refund 250 (order for 250)?" and wait["expires_at"] is None
        assert http.get("/agents/cashier/c-1/waits").json()["waits"] == [wait]
        assert http.get(f"/agents/cashier/c-1/submissions/{sid}").json()["status"] == "waiting"
        path = f"/agents/cashier/c-1/waits/{wait['wait_id']}"

        bad = http.post(path, content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400
        assert http.post(path, json={"val": True}).status_code == 400
        assert http.post(path, json={"value": True, "extra": 1}).status_code == 400
        missing = http.post("/agents/cashier/c-1/waits/w_nope", json={"value": True})
        assert (missing.status_code, missing.json()["error"]["type"]) == (404, "wait_not_found")
        assert (
            http.post(f"/agents/nobody/c-1/waits/{wait['wait_id']}", json={"value": 1}).json()[
                "error"
            ]["type"]
            == "unknown_agent"
        )

        first = http.post(path, json={"value": {"ok": True}})
        assert first.status_code == 200
        assert first.json() == {"wait_id": wait["wait_id"], "submission_id": sid, "resolved": True}
        assert http.post(path, json={"value": {"ok": True}}).status_code == 200
        other = http.post(path, json={"value": {"ok": False}})
        assert (other.status_code, other.json()["error"]["type"]) == (409, "wait_conflict")

        done = settled(http, "cashier/c-1", sid)
        assert done["outcome"] == "completed"
        assert done["reply"] == "done: {'refunded': 250, 'approval': {'ok': True}}"
        assert http.post(path, json={"value": {"ok": True}}).status_code == 200  # after settling
        assert http.post(path, json={"value": "no"}).status_code == 409
        assert http.get("/waits").json() == {"waits": []}
        spec = http.get("/openapi.json").json()
        assert "/agents/{agent}/{id}/waits/{wait_id}" in spec["paths"] and "/waits" in spec["paths"]


def test_resolving_a_wait_of_an_aborted_submission_is_a_conflict(
    wait_server: ThreadServer,
) -> None:
    with wait_server.client() as http:
        sid = http.post("/agents/cashier/c-1", json={"message": "refund 250"}).json()[
            "submission_id"
        ]
        [wait] = pending(http)
        assert http.post("/agents/cashier/c-1/abort").json()["submission_ids"] == [sid]
        assert settled(http, "cashier/c-1", sid)["outcome"] == "aborted"
        answer = http.post(f"/agents/cashier/c-1/waits/{wait['wait_id']}", json={"value": 1})
        assert answer.status_code == 409


def test_the_sdk_resolves_waits_sync_and_async(wait_server: ThreadServer) -> None:
    with hearth.Client(wait_server.url) as client:
        conv = client.conversation("cashier", "c-1")
        receipt = conv.send("refund 250")
        wait_until(lambda: len(client.waits()) == 1, timeout=20)
        [wait] = conv.waits()
        answer = conv.resolve(wait["wait_id"], "yes")
        assert answer["resolved"] and answer["submission_id"] == receipt.submission_id
        with pytest.raises(hearth.WaitConflict):
            conv.resolve(wait["wait_id"], "no")
        with pytest.raises(hearth.WaitNotFound):
            conv.resolve("w_nope", "yes")
        assert "'approval': 'yes'" in conv.read(receipt, timeout=20).text

    async def main() -> str:
        async with hearth.AsyncClient(wait_server.url) as client:
            conv = client.conversation("cashier", "c-2")
            receipt = await conv.send("refund 300")
            while not await conv.waits():
                await asyncio.sleep(0.05)
            [wait] = await client.waits()
            await conv.resolve(wait["wait_id"], "sure")
            with pytest.raises(hearth.WaitConflict):
                await conv.resolve(wait["wait_id"], "nope")
            return (await conv.read(receipt, timeout=20)).text

    assert "'approval': 'sure'" in asyncio.run(main())


def test_the_cli_lists_and_resolves_waits_through_the_server(wait_server: ThreadServer) -> None:
    with wait_server.client() as http:
        sid = http.post("/agents/cashier/c-1", json={"message": "refund 250"}).json()[
            "submission_id"
        ]
        [wait] = pending(http)
        listed = cli("waits", "--url", wait_server.url)
        assert listed.returncode == 0 and "approval" in listed.stdout
        inspected = cli("inspect", "--url", wait_server.url)  # "1/1": a retry budget used up
        assert inspected.returncode == 0 and "0/1 (+1 wait)" in inspected.stdout
        as_json = cli("waits", "--url", wait_server.url, "--json")
        assert [w["wait_id"] for w in json.loads(as_json.stdout)["waits"]] == [wait["wait_id"]]
        # A negative number is the value, not an unknown option (it needed a "--" before it).
        done = cli("resolve", "cashier", "c-1", wait["wait_id"], "-1.5", "--url", wait_server.url)
        assert done.returncode == 0, done.stderr
        missing = cli("resolve", "cashier", "c-1", "w_nope", "1", "--url", wait_server.url)
        assert missing.returncode == 1 and "no wait" in missing.stderr
        typo = cli("resolve", "cashier", "c-1", "w_nope", "1", "--urll", wait_server.url)
        assert typo.returncode == 2 and "--urll" in typo.stderr
        answer = settled(http, "cashier/c-1", sid)
        assert answer["outcome"] == "completed" and answer["reply"].endswith("'approval': -1.5}")


# --- real processes ----------------------------------------------------------------------------
def serve(db: Path | str, tmp_path: Path, **env: str) -> ServerProcess:
    paths = os.pathsep.join([str(APPS), str(HERE), str(SRC)])
    settings = {"PYTHONPATH": paths, "HEARTH_TEST_LOG": str(tmp_path / "tools.log"), **env}
    return ServerProcess(db, app="waitapp:app", env=settings, log=tmp_path / "server.log")


def ran(tmp_path: Path, what: str) -> int:
    log = tmp_path / "tools.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if line.split("|")[0] == what)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "hearth", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.crash
def test_sigkill_while_waiting_then_restart_and_resolve_completes_with_the_value(
    tmp_path: Path,
) -> None:
    server = serve(tmp_path / "h.db", tmp_path).start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            sid = http.post("/agents/cashier/c-1", json={"message": "refund 700"}).json()[
                "submission_id"
            ]
            [wait] = pending(http)
            server.kill()
            server.start()
            assert http.get("/waits").json()["waits"] == [wait]  # it survived, still pending
            path = f"/agents/cashier/c-1/waits/{wait['wait_id']}"
            assert http.post(path, json={"value": "approved by ana"}).status_code == 200
            done = settled(http, "cashier/c-1", sid)
        assert done["outcome"] == "completed"
        assert done["reply"] == "done: {'refunded': 700, 'approval': 'approved by ana'}"
        assert done["attempt"] == 2  # the wait ended attempt 1; the kill interrupted nothing
    finally:
        server.kill()
    assert (ran(tmp_path, "step-load"), ran(tmp_path, "step-pay")) == (1, 1)
    asyncio.run(with_store(str(tmp_path / "h.db"), assert_invariants))


@pytest.mark.crash
def test_a_resolve_written_while_no_process_runs_is_completed_by_the_next_start(
    tmp_path: Path,
) -> None:
    db = tmp_path / "h.db"
    server = serve(db, tmp_path).start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            sid = http.post("/agents/cashier/c-1", json={"message": "refund 900"}).json()[
                "submission_id"
            ]
            [wait] = pending(http)
            server.kill()
            listed = cli("waits", "--db", f"sqlite:///{db}")
            assert listed.returncode == 0 and wait["wait_id"] in listed.stdout
            # Refused as the HTTP route refuses them (NaN was stored: every read answered 500).
            for odd, says in (("NaN", "must be JSON"), ('"cut \\ud83d"', "surrogate")):
                refused = cli("resolve", "cashier", "c-1", wait["wait_id"], odd, "--db", str(db))
                assert refused.returncode == 1 and says in refused.stderr, refused.stderr
            done = cli(
                "resolve", "cashier", "c-1", wait["wait_id"], '{"by": "cli"}', "--db", str(db)
            )
            assert done.returncode == 0, done.stderr
            assert f"submission {sid}" in done.stdout
            again = cli("resolve", "cashier", "c-1", wait["wait_id"], "false", "--db", str(db))
            assert again.returncode == 1 and "another value" in again.stderr
            bad = cli("resolve", "cashier", "c-1", wait["wait_id"], "not json", "--db", str(db))
            assert bad.returncode == 1 and "must be JSON" in bad.stderr
            server.start()
            answer = settled(http, "cashier/c-1", sid)
        assert answer["reply"] == "done: {'refunded': 900, 'approval': {'by': 'cli'}}"
    finally:
        server.kill()
    assert (ran(tmp_path, "step-load"), ran(tmp_path, "step-pay")) == (1, 1)
    asyncio.run(with_store(str(db), assert_invariants))


@pytest.mark.crash
def test_a_timeout_that_passed_while_no_process_ran_ends_the_wait_at_the_next_start(
    tmp_path: Path,
) -> None:
    db = tmp_path / "h.db"
    server = serve(db, tmp_path, HEARTH_TEST_WAIT_S="1", HEARTH_SCAN_S="60").start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            sid = http.post("/agents/cashier/c-1", json={"message": "refund 400"}).json()[
                "submission_id"
            ]
            [wait] = pending(http)
            assert wait["expires_at"] is not None
            server.kill()
            records = asyncio.run(with_store(str(db), lambda s: s.read("cashier/c-1")))
            assert not any(isinstance(r, WaitResolved) for r in records)
            time.sleep(1.2)
            server.start()
            answer = settled(http, "cashier/c-1", sid)
        assert answer["reply"] == "done: {'refunded': 0, 'why': 'nobody approved in time'}"
    finally:
        server.kill()
    assert ran(tmp_path, "step-pay") == 0


@pytest.mark.crash
def test_on_postgresql_a_wait_survives_sigkill_and_a_resolve_from_outside(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    url = pg_cluster.url()
    server = serve(url, tmp_path).start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            sid = http.post("/agents/cashier/c-1", json={"message": "refund 650"}).json()[
                "submission_id"
            ]
            [wait] = pending(http)
            server.kill()
            done = cli("resolve", "cashier", "c-1", wait["wait_id"], "true", "--db", url)
            assert done.returncode == 0, done.stderr
            server.start()
            answer = settled(http, "cashier/c-1", sid)
        assert answer["reply"] == "done: {'refunded': 650, 'approval': True}"
    finally:
        server.kill()
    assert (ran(tmp_path, "step-load"), ran(tmp_path, "step-pay")) == (1, 1)
    asyncio.run(with_store(url, assert_invariants))


def test_a_wait_in_a_subagent_the_app_does_not_list_is_read_and_resolved_over_http(
    tmp_path: Path,
) -> None:
    """GET /waits listed it, and then its conversation and its resolve answered 404
    unknown_agent: the parent waited for good."""
    from test_subagents import answering, manager

    models = [
        ScriptedModel("manager", answering(calls(call("task", agent="clerk", prompt="x")))),
        ScriptedModel("clerk", answering(calls(call("approve")))),
    ]
    app = hearth.App([manager], db=str(tmp_path / "h.db"), providers=models, port=0)
    server = ThreadServer(app).start()
    try:
        with server.client() as http:
            sid = http.post("/agents/manager/p", json={"message": "go"}).json()["submission_id"]
            (wait,) = pending(http)
            agent, _, id = wait["conversation_id"].partition("/")
            base = f"/agents/{agent}/{id}"
            assert http.get(base).status_code == 200
            assert http.get(f"{base}/stream").json()["records"]
            assert [w["wait_id"] for w in http.get(f"{base}/waits").json()["waits"]] == [
                wait["wait_id"]
            ]
            resolved = http.post(f"{base}/waits/{wait['wait_id']}", json={"value": "yes"})
            assert resolved.status_code == 200, resolved.text
            done = http.get(f"/agents/manager/p/submissions/{sid}", params={"wait": 10}).json()
            assert (done["outcome"], done["reply"]) == ("completed", "approved yes")
            refused = http.post(base, json={"message": "hi"})  # as any delegated conversation
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["type"] == "delegated_conversation"
            refused = http.post(f"{base}/abort")  # nothing of its own: its parent is aborted
            assert refused.status_code == 409, refused.text
            assert "abort manager/p" in refused.json()["error"]["message"]
            assert http.get("/agents/clerk/never-made").status_code == 404
    finally:
        server.stop()


def early_server(tmp_path: Path) -> tuple[EarlyWaits, ThreadServer]:
    early = EarlyWaits(str(tmp_path / "h.db"))
    return early, ThreadServer(early.app).start()


def answer_meanwhile(http: httpx2.Client, wait_id: str, value: Any) -> queue.Queue[httpx2.Response]:
    """Answer ``wait_id`` of ``early/c-1`` from a thread; its response arrives in the queue."""
    answers: queue.Queue[httpx2.Response] = queue.Queue()
    path = f"/agents/early/c-1/waits/{wait_id}"
    threading.Thread(
        target=lambda: answers.put(http.post(path, json={"value": value})), daemon=True
    ).start()
    return answers


def test_an_early_answer_over_http_is_held_until_its_wait_is_recorded(tmp_path: Path) -> None:
    early, server = early_server(tmp_path)
    try:
        with httpx2.Client(base_url=server.url, timeout=30) as http:
            sid = http.post("/agents/early/c-1", json={"message": "go"}).json()["submission_id"]
            _, wait_id = early.first_asked()
            answers = answer_meanwhile(http, wait_id, "yes")
            time.sleep(0.3)
            assert answers.empty()  # held: the batch has not paused
            early.release.set()
            answer = answers.get(timeout=20)
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"wait_id": wait_id, "submission_id": sid, "resolved": True}
            assert settled(http, "early/c-1", sid)["outcome"] == "completed"
    finally:
        early.release.set()
        server.stop()


def test_a_shutdown_answers_a_held_answer_503_to_send_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was held its whole 20 s, holding the shutdown, and then answered 404 wait_not_found:
    a client took the answer as refused, and the wait stayed pending after the restart."""
    monkeypatch.setattr("hearth.runtime.runtime.EARLY_ANSWER_S", 600.0)
    early, server = early_server(tmp_path)
    try:
        with httpx2.Client(base_url=server.url, timeout=60) as http:
            http.post("/agents/early/c-1", json={"message": "go"})
            _, wait_id = early.first_asked()
            answers = answer_meanwhile(http, wait_id, "yes")
            time.sleep(0.3)
            stopping = threading.Thread(target=server.stop, daemon=True)
            stopping.start()
            # Answered as the shutdown begins, not once its grace (20 s) has run out.
            answer = answers.get(timeout=10)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["type"] == "shutting_down"
            early.release.set()
            stopping.join(30)
    finally:
        early.release.set()
        server.stop()


def test_a_held_answer_whose_client_hung_up_is_not_given(tmp_path: Path) -> None:
    """The client gave up (its timeout) and was told nothing; the answer was given seconds
    later anyway, and a second try with another value met a 409."""
    early, server = early_server(tmp_path)
    try:
        with httpx2.Client(base_url=server.url, timeout=30) as http:
            http.post("/agents/early/c-1", json={"message": "go"})
            _, wait_id = early.first_asked()
            with pytest.raises(httpx2.ReadTimeout):
                http.post(f"/agents/early/c-1/waits/{wait_id}", json={"value": "gone"}, timeout=0.5)
            time.sleep(0.5)  # (the server hears of the hang-up)
            early.release.set()
            pending(http)
            time.sleep(1.5)  # (past a held answer's next look: it would have been given by now)
            [waiting] = pending(http)
            assert waiting["wait_id"] == wait_id  # still pending: nobody was told it was given
            again = http.post(f"/agents/early/c-1/waits/{wait_id}", json={"value": "yes"})
            assert again.status_code == 200, again.text
    finally:
        early.release.set()
        server.stop()
