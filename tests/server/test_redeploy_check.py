"""``hearth check`` (SPEC §17): work left in flight by a real server running version 1 of an
app (``deploy_v1``), checked against version 2 (``deploy_v2``) on SQLite (server killed) and on
PostgreSQL (server running beside), and then recovered by version 2 as the check predicted."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from httpharness import HERE, SRC, ServerProcess, child_env, free_port, wait_until
from pgcluster import Cluster

import hearth

APPS = HERE.parent / "apps"
ENV = {"PYTHONPATH": f"{APPS}:{HERE}:{SRC}"}
WORK = {  # conversation → first message; each leaves one call (or a stall) in flight
    ("shop", "s-ship"): "ship",
    ("shop", "s-bill"): "bill",
    ("shop", "s-keep"): "keep",
    ("shop", "s-ask"): "ask",
    ("shop", "s-lookup"): "lookup",
    ("shop", "s-delegate"): "delegate",
    ("legacy", "l-1"): "hello",
}
EXPECTED = {  # what version 2 would withdraw, per conversation
    "shop/s-ship": ("durable_tool_withdrawn", "ship", "no longer declared"),
    "shop/s-bill": ("durable_tool_withdrawn", "bill", "no longer durable"),
    "shop/s-ask": ("wait_orphaned", "ask", "no longer declared"),
    "shop/s-delegate": ("delegate_removed", "packer", "subagent_missing"),
    "shop/s-lookup": ("tool_removed", "lookup", "no longer declared"),
    "legacy/l-1": ("agent_removed", "legacy", "agent_missing"),
}


def hearth_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hearth", *args],
        capture_output=True,
        text=True,
        env=child_env(**ENV),
        timeout=120,
    )


def check(app: str, db: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return hearth_cli("check", app, "--db", db, *extra)


def types(conv: Any) -> list[str]:
    return [r["type"] for r in conv.history()]


def leave_work_in_flight(url: str) -> None:
    """Start every piece of ``WORK`` on the version 1 server at ``url`` and wait until each is
    where the tests need it: a step recorded, a wait pending, a call or a stall under way."""
    with hearth.Client(url) as client:
        for (agent, id), text in WORK.items():
            client.conversation(agent, id).send(text)

        def status(agent: str, id: str) -> str:
            return str(client.conversation(agent, id).snapshot()["submissions"][0]["status"])

        for id in ("s-ship", "s-bill", "s-keep"):
            conv = client.conversation("shop", id)
            wait_until(lambda conv=conv: "tool_step_settled" in types(conv), timeout=30)
        wait_until(lambda: status("shop", "s-ask") == "waiting", timeout=30)
        lookup = client.conversation("shop", "s-lookup")
        wait_until(lambda: "assistant_tool_call" in types(lookup), timeout=30)
        legacy = client.conversation("legacy", "l-1")
        wait_until(lambda: "user_message" in types(legacy), timeout=30)
        parent = client.conversation("shop", "s-delegate")
        wait_until(lambda: "child_conversation_linked" in types(parent), timeout=30)
        [link] = [r for r in parent.history() if r["type"] == "child_conversation_linked"]
        child = client.conversation(*link["child_conversation_id"].split("/", 1))
        wait_until(lambda: "tool_step_settled" in types(child), timeout=30)


def by_conversation(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {s["conversation_id"]: s["findings"] for s in report["affected"]}


def assert_predicted(report: dict[str, Any]) -> None:
    found = by_conversation(report)
    assert set(found) == set(EXPECTED)  # s-keep's durable tool stays: nothing to report
    for conversation, (kind, name, says) in EXPECTED.items():
        [finding] = found[conversation]
        assert (finding["kind"], finding["name"], finding["withdraws"]) == (kind, name, True)
        assert says in finding["message"]
    assert report["withdrawn"] is True and report["checked"] == len(WORK)


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# --- SQLite: the server was killed with the work in flight ------------------------------------


@pytest.fixture(scope="module")
def killed_v1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A SQLite file that a version 1 server left with ``WORK`` in flight when it was killed."""
    db = tmp_path_factory.mktemp("redeploy") / "h.db"
    server = ServerProcess(db, app="deploy_v1:app", env=ENV).start()
    try:
        leave_work_in_flight(server.url)
    finally:
        server.kill()
    yield db


def contents(db: Path) -> list[Any]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [
            conn.execute('SELECT * FROM records ORDER BY conversation_id, "offset"').fetchall(),
            conn.execute("SELECT * FROM submissions ORDER BY seq").fetchall(),
            conn.execute("SELECT * FROM waits ORDER BY seq").fetchall(),
            conn.execute("SELECT * FROM state ORDER BY conversation_id, name").fetchall(),
        ]


def test_the_check_changes_nothing_in_the_file_not_even_an_older_schema(
    killed_v1: Path, tmp_path: Path
) -> None:
    """It opened the file itself: an older schema was migrated in place (the release still
    running would then refuse to start on it), and its open time was rewritten."""
    older = tmp_path / "older.db"
    with contextlib.closing(sqlite3.connect(killed_v1)) as source:
        with contextlib.closing(sqlite3.connect(older)) as conn:
            source.backup(conn)
            conn.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
            conn.commit()
    before = older.read_bytes()
    done = check("deploy_v2:app", f"sqlite:///{older}")
    assert done.returncode == 1, done.stderr  # the findings, on a copy
    assert older.read_bytes() == before
    # (Reading a file in WAL mode makes its -wal and -shm files: nothing else is left.)
    assert {p.name for p in tmp_path.iterdir()} <= {"older.db", "older.db-wal", "older.db-shm"}
    with contextlib.closing(sqlite3.connect(older)) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == ("8",)


def test_the_code_that_accepted_the_work_withdraws_nothing(killed_v1: Path) -> None:
    done = check("deploy_v1:app", f"sqlite:///{killed_v1}", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["withdrawn"], report["checked"], report["affected"]) == (False, len(WORK), [])


def test_each_withdrawal_of_the_new_code_is_reported_and_exits_1(killed_v1: Path) -> None:
    before = contents(killed_v1)
    done = check("deploy_v2:app", f"sqlite:///{killed_v1}", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert_predicted(json.loads(done.stdout))
    assert contents(killed_v1) == before  # read only: nothing claimed, written or run


def test_the_text_report_has_one_line_per_affected_submission_and_a_summary(
    killed_v1: Path,
) -> None:
    done = check("deploy_v2:app", f"sqlite:///{killed_v1}")
    assert done.returncode == 1
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(EXPECTED) + 1
    for conversation, (kind, _, _) in EXPECTED.items():
        [line] = [line for line in lines if line.startswith(f"{conversation} ")]
        assert f"{kind}:" in line
    assert lines[-1] == (
        f"{len(WORK)} unsettled submission(s) checked; {len(EXPECTED)} affected,"
        f" {len(EXPECTED)} with a durable contract withdrawn"
    )


def copy_of(db: Path, name: str) -> Path:
    copy = db.parent / name / "h.db"
    copy.parent.mkdir()
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{db}{suffix}")
        if source.exists():
            shutil.copy(source, f"{copy}{suffix}")
    return copy


def test_serve_strict_refuses_to_start_and_prints_the_findings(killed_v1: Path) -> None:
    copy = copy_of(killed_v1, "strict")
    done = hearth_cli(
        "serve", "deploy_v2:app", "--db", f"sqlite:///{copy}", "--port", "0", "--strict"
    )
    assert done.returncode == 1
    assert "--strict" in done.stderr and "serving" not in done.stdout
    for conversation in EXPECTED:
        assert conversation in done.stderr


def test_serve_strict_starts_when_nothing_would_be_withdrawn(killed_v1: Path) -> None:
    copy = copy_of(killed_v1, "strict-ok")
    server = ServerProcess(copy, app="deploy_v1:app", env=ENV, args=("--strict",)).start()
    try:
        assert "serving http" in server.ready_line
    finally:
        server.kill()


def test_recovery_under_the_new_code_does_what_the_check_said(killed_v1: Path) -> None:
    copy = copy_of(killed_v1, "recovered")
    server = ServerProcess(copy, app="deploy_v2:app", env=ENV).start()
    try:
        with hearth.Client(server.url) as client:

            def outcome(agent: str, id: str, kind: str) -> dict[str, Any] | None:
                records = client.conversation(agent, id).history()
                found = [r for r in records if r["type"] == kind]
                return found[0] if found else None

            def error_type(id: str) -> str | None:
                found = outcome("shop", id, "tool_outcome")
                return None if found is None else found["content"]["type"]

            for id in ("s-ship", "s-bill", "s-lookup"):
                wait_until(lambda id=id: error_type(id) == "interrupted", timeout=30)
            wait_until(lambda: error_type("s-delegate") == "subagent_missing", timeout=30)

            def legacy() -> dict[str, Any]:
                [sub] = client.admin_submissions("legacy/l-1")["recent"] or [{}]
                return sub

            wait_until(lambda: legacy().get("outcome") is not None, timeout=30)
            assert (legacy()["outcome"], legacy()["error"]["type"]) == ("failed", "agent_missing")
            resolved = client.conversation("shop", "s-ask").resolve(
                client.conversation("shop", "s-ask").waits()[0]["wait_id"], True
            )
            assert resolved["resolved"] is True
            wait_until(lambda: error_type("s-ask") == "interrupted", timeout=30)
            assert outcome("shop", "s-keep", "tool_outcome") is None  # re-executing: blocks
    finally:
        server.kill()


# --- what the check refuses: exit 2, one line ---------------------------------------------------


def test_an_app_that_does_not_import_is_one_line_and_exit_2(killed_v1: Path) -> None:
    done = check("deploy_broken:app", f"sqlite:///{killed_v1}")
    assert done.returncode == 2
    assert "does not even import" in one_line(done.stderr)


def test_an_unreachable_database_is_one_line_and_exit_2() -> None:
    done = check("deploy_v2:app", f"postgresql://hearth@127.0.0.1:{free_port()}/nowhere")
    assert done.returncode == 2
    assert "cannot connect" in one_line(done.stderr)


def test_a_missing_sqlite_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = check("deploy_v2:app", f"sqlite:///{tmp_path / 'none.db'}")
    assert done.returncode == 2
    assert "no database" in one_line(done.stderr)
    assert not (tmp_path / "none.db").exists()


def test_a_sqlite_path_with_a_hash_or_question_mark_is_the_file_checked(killed_v1: Path) -> None:
    """The path went unquoted into a ``file:`` URI: ``#`` and ``?`` ended it, so another (new,
    empty) file was read and the check said all clear, exit 0."""
    copy = copy_of(killed_v1, "prod#1?x")
    done = check("deploy_v2:app", str(copy), "--json")  # a path: in a URL, "?" starts options
    assert done.returncode == 1, done.stdout + done.stderr
    assert_predicted(json.loads(done.stdout))
    assert not (killed_v1.parent / "prod").exists()


def test_another_programs_sqlite_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Its copy was opened as a new hearth database: no submissions, all clear, exit 0."""
    other = tmp_path / "inventory.db"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)")
        conn.commit()
    done = check("deploy_v2:app", f"sqlite:///{other}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "holds no hearth database" in one_line(done.stderr)


def test_a_fifo_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Reading a FIFO as the database waited for a writer: the check never ended."""
    fifo = tmp_path / "h.db"
    os.mkfifo(fifo)
    done = check("deploy_v2:app", f"sqlite:///{fifo}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not a file" in one_line(done.stderr)


def test_a_database_on_a_read_only_mount_is_checked(killed_v1: Path, tmp_path: Path) -> None:
    """The copy went beside the file: a backup on a read-only mount could not be checked."""
    mount = tmp_path / "ro"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    try:
        copy = copy_of(killed_v1, "source")
        (mount / "backup").mkdir()
        for suffix in ("", "-wal"):
            if Path(f"{copy}{suffix}").exists():
                shutil.copy(f"{copy}{suffix}", mount / "backup" / f"h.db{suffix}")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        done = check("deploy_v2:app", str(mount / "backup" / "h.db"), "--json")
        assert done.returncode == 1, done.stdout + done.stderr
        assert_predicted(json.loads(done.stdout))
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_sqlite_file_held_by_a_running_server_is_one_line_and_exit_2(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "h.db", app="deploy_v1:app", env=ENV).start()
    try:
        done = check("deploy_v2:app", f"sqlite:///{tmp_path / 'h.db'}")
    finally:
        server.kill()
    assert done.returncode == 2
    assert "stop the server" in one_line(done.stderr)


# --- PostgreSQL: the check runs beside a live server ------------------------------------------


def test_on_postgresql_the_check_runs_beside_the_servers(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    url = pg_cluster.url()
    server = ServerProcess(url, app="deploy_v1:app", env=ENV, log=tmp_path / "server.log")
    server.start()
    try:
        leave_work_in_flight(server.url)
        same = check("deploy_v1:app", url, "--json")
        assert same.returncode == 0, same.stdout + same.stderr
        assert json.loads(same.stdout)["affected"] == []
        done = check("deploy_v2:app", url, "--json")
        assert done.returncode == 1, done.stdout + done.stderr
        assert_predicted(json.loads(done.stdout))
        with hearth.Client(server.url) as client:  # the live server kept its work
            snapshot = client.conversation("shop", "s-keep").snapshot()
            assert snapshot["submissions"][0]["status"] == "running"
    finally:
        server.kill()
