"""Attachments with real ``hearth serve`` processes, on SQLite and on PostgreSQL: a SIGKILL right
after the 202 loses neither the bytes nor the submission, a refused request stores nothing, and
the SDK, ``hearth send --attach`` and ``hearth gc`` work against a live server."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from httpharness import ServerProcess, child_env
from pgcluster import Cluster, new_schema

import hearth
from hearth.store import Blob, NewSubmission, Store, open_store

pytestmark = pytest.mark.crash

PDF = b"%PDF-1.4\n" + bytes(range(256)) * 400 + b"\n%%EOF\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'h.db'}"
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    return cluster.url(new_schema())


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for proc in started:
        proc.kill()


def serve(db: str, tmp_path: Path, procs: list[ServerProcess], **env: str) -> ServerProcess:
    proc = ServerProcess(db, env=env, log=tmp_path / f"server{len(procs)}.log")
    procs.append(proc)
    return proc.start()


def read_store(db: str, work: Any) -> Any:
    """Run ``work(store)`` on the database, with no server holding it."""

    async def main() -> Any:
        store: Store = open_store(db)
        await store.open()
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(main())


def test_a_sigkill_right_after_the_202_loses_neither_bytes_nor_submission(
    db: str, tmp_path: Path, procs: list[ServerProcess]
) -> None:
    server = serve(db, tmp_path, procs)
    files = [("file", ("report.pdf", PDF, "application/pdf"))]
    answer = httpx2.post(
        f"{server.url}/agents/echo/c-1", data={"message": "read it"}, files=files, timeout=10
    )
    assert answer.status_code == 202, answer.text
    server.kill()  # SIGKILL at once: only what was durable at the 202 survives

    async def check(store: Store) -> tuple[Blob | None, Any]:
        return await store.get_attachment(sha(PDF)), await store.get_submission(
            answer.json()["submission_id"]
        )

    blob, sub = read_store(db, check)
    assert blob is not None and blob.data == PDF
    assert sub is not None and sub.payload["attachments"][0]["sha256"] == sha(PDF)
    again = serve(db, tmp_path, procs)
    with httpx2.Client(base_url=again.url, timeout=10) as http:
        assert http.get(f"/attachments/{sha(PDF)}").content == PDF
        status = http.get(
            f"/agents/echo/c-1/submissions/{answer.json()['submission_id']}", params={"wait": 20}
        ).json()
    assert status["outcome"] == "completed"


def test_a_refused_request_stores_nothing(
    db: str, tmp_path: Path, procs: list[ServerProcess]
) -> None:
    server = serve(db, tmp_path, procs, HEARTH_MAX_ATTACHMENT="1000")
    with httpx2.Client(base_url=server.url, timeout=10) as http:
        too_big = http.post(
            "/agents/echo/c-1",
            data={"message": "x"},
            files=[("file", ("ok.txt", b"fine", "text/plain")),
                   ("file", ("big.pdf", PDF, "application/pdf"))],
        )  # fmt: skip
        bad = http.post(
            "/agents/echo/c-1",
            json={"message": "x", "attachments": [{"name": "a", "data": "%%%"}]},
        )
        conflict_first = http.post(
            "/agents/echo/c-2", json={"message": "x", "idempotency_key": "k"}
        )
        conflict = http.post(
            "/agents/echo/c-2",
            json={
                "message": "x",
                "idempotency_key": "k",
                "attachments": [{"name": "n.txt", "data": "bm90ZQ=="}],
            },
        )
    assert too_big.status_code == 413 and "big.pdf" in too_big.json()["error"]["message"]
    assert bad.status_code == 400
    assert conflict_first.status_code == 202 and conflict.status_code == 409
    server.kill()

    async def check(store: Store) -> tuple[list[Blob], list[Any]]:
        subs = await store.list_submissions("echo/c-1")
        return await store.collect_attachments(dry_run=True), subs

    orphans, subs = read_store(db, check)
    assert orphans == [] and subs == []
    note = read_store(db, lambda store: store.get_attachment(sha(b"note")))
    fine = read_store(db, lambda store: store.get_attachment(sha(b"fine")))
    assert note is None and fine is None


def test_the_sdk_sends_attachments_sync_and_async(
    db: str, tmp_path: Path, procs: list[ServerProcess]
) -> None:
    server = serve(db, tmp_path, procs)
    path = tmp_path / "notes.txt"
    path.write_text("from a path\n")
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        receipt = conv.send("see", attachments=[hearth.Attachment(PDF, "r.pdf"), path])
        assert conv.read(receipt, timeout=20).outcome == "completed"
        [message] = [r for r in conv.history() if r["type"] == "user_message"]

    async def send_async() -> Any:
        async with hearth.AsyncClient(server.url) as client:
            conv = client.conversation("echo", "c-2")
            receipt = await conv.send(attachments=[hearth.Attachment(b"only a file", "f.txt")])
            await conv.read(receipt, timeout=20)
            return [r for r in await conv.history() if r["type"] == "user_message"]

    [alone] = asyncio.run(send_async())
    names = [(p["name"], p["media_type"]) for p in message["content"][1:]]
    assert names == [("r.pdf", "application/pdf"), ("notes.txt", "text/plain")]
    assert [p["name"] for p in alone["content"]] == ["f.txt"]
    with hearth.Client(server.url) as client, pytest.raises(hearth.AttachmentTooLarge):
        client.conversation("echo", "c-3").send(
            "x", attachments=[hearth.Attachment(b"x" * (20 * 1024 * 1024 + 1), "huge.bin")]
        )


def hearth_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hearth", *args],
        capture_output=True,
        text=True,
        env={**child_env(), **(env or {})},
        timeout=60,
        check=False,
    )


def test_hearth_send_attaches_files(db: str, tmp_path: Path, procs: list[ServerProcess]) -> None:
    server = serve(db, tmp_path, procs)
    one, two = tmp_path / "one.pdf", tmp_path / "two.txt"
    one.write_bytes(PDF)
    two.write_text("second\n")
    done = hearth_cli(
        "send", "echo", "c-1", "both", "--attach", str(one), "--attach", str(two),
        "--url", server.url, "--wait",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with hearth.Client(server.url) as client:
        [message] = [
            r for r in client.conversation("echo", "c-1").history() if r["type"] == "user_message"
        ]
    assert [p.get("name") for p in message["content"][1:]] == ["one.pdf", "two.txt"]
    tail = hearth_cli("tail", "echo", "c-1", "--no-follow", "--url", server.url)
    assert f"both [one.pdf (application/pdf, {len(PDF)} B)] [two.txt (text/plain, 7 B)]" in (
        tail.stdout
    ), tail.stdout
    missing = hearth_cli("send", "echo", "c-1", "x", "--attach", str(tmp_path / "nope"))
    assert missing.returncode != 0 and "nope" in missing.stderr


def _orphan(db: str) -> bytes:
    """Store bytes that nothing references (as a deleted conversation would leave them)."""
    data = b"nobody points here"
    blob = Blob(sha(data), "text/plain", len(data), data)

    async def admit(store: Store) -> None:
        await store.admit(NewSubmission("echo/o-1", "echo", "message", {"m": 1}, blobs=(blob,)))

    read_store(db, admit)
    return data


def test_hearth_gc_frees_only_unreferenced_attachments(
    db: str, tmp_path: Path, procs: list[ServerProcess]
) -> None:
    orphan = _orphan(db)
    server = serve(db, tmp_path, procs)
    with hearth.Client(server.url) as client:
        client.conversation("echo", "c-1").send("kept", attachments=[hearth.Attachment(PDF, "k")])
    if db.startswith("sqlite"):
        refused = hearth_cli("gc", "--db", db)
        assert refused.returncode == 2
        assert "stop it first, or use --url" in refused.stderr
    dry = hearth_cli("gc", "--url", server.url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert sha(orphan) in dry.stdout and "would free 1 attachment(s)" in dry.stdout
    # The server's URL from HEARTH_URL, as the other commands take it (it was refused).
    dry = hearth_cli("gc", "--dry-run", env={"HEARTH_URL": server.url})
    assert dry.returncode == 0, dry.stderr
    assert "would free 1 attachment(s)" in dry.stdout
    freed = hearth_cli("gc", "--url", server.url)
    assert freed.returncode == 0, freed.stderr
    assert f"freed 1 attachment(s), {len(orphan)} bytes" in freed.stdout
    with httpx2.Client(base_url=server.url, timeout=10) as http:
        assert http.get(f"/attachments/{sha(orphan)}").status_code == 404
        assert http.get(f"/attachments/{sha(PDF)}").content == PDF
    server.kill()
    again = _orphan(db)
    direct = hearth_cli("gc", "--db", db)
    assert direct.returncode == 0, direct.stderr
    assert sha(again) in direct.stdout and "freed 1 attachment(s)" in direct.stdout
    assert read_store(db, lambda store: store.get_attachment(sha(PDF))) is not None
    both = hearth_cli("gc", "--db", db, "--url", server.url)
    assert both.returncode == 2 and "give one of --db" in both.stderr
