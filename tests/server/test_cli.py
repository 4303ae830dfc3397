"""The ``hearth`` command: serve, send, tail, inspect, migrate, demo; errors as one line."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner
from httpharness import HERE, ServerProcess, ThreadServer, answering, child_env, free_port
from pgcluster import Cluster

from hearth.cli import main
from hearth.store.sqlite_schema import SCHEMA_VERSION


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def one_line_error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def test_send_prints_the_submission_and_waits_for_the_reply(server: ThreadServer) -> None:
    code, out = run("send", "echo", "c-1", "hello", "--url", server.url)
    assert code == 0 and out.startswith("s_") and "admitted to echo/c-1" in out
    code, out = run("send", "echo", "c-1", "again", "--url", server.url, "--wait")
    assert code == 0 and out.strip().endswith("echo: again")
    code, out = run("send", "echo", "c-2", "x", "--url", server.url, "--json")
    assert json.loads(out)["conversation_id"] == "echo/c-2"


def test_send_wait_shows_a_replys_control_characters_escaped_on_a_terminal(
    server: ThreadServer,
) -> None:
    """A reply that echoes ESC sequences (a window title, OSC 52 writing the clipboard) drove the
    operator's terminal; ``hearth tail`` showed them escaped. A pipe still gets them as they are."""
    message = "x \x1b]0;PWNED\x07 \x1b]52;c;ZWNobw==\x07\nsecond line"
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "hearth", "send", "echo", "esc", message, "--wait"]
    with subprocess.Popen(
        [*command, "--url", server.url], stdout=follower, stderr=subprocess.DEVNULL, env=child_env()
    ) as proc:
        os.close(follower)
        shown = b""
        with contextlib.suppress(OSError):  # (EIO once the child has closed its end)
            while chunk := os.read(leader, 4096):
                shown += chunk
        os.close(leader)
        assert proc.wait(30) == 0
    assert b"\x1b" not in shown and b"\x07" not in shown
    assert b"\\x1b]0;PWNED\\x07" in shown and b"second line" in shown
    code, out = run("send", "echo", "esc", message, "--url", server.url, "--wait")
    assert code == 0 and "\x1b]0;PWNED\x07" in out  # piped: as the model wrote it


def test_send_reports_a_failed_outcome_as_one_line(server: ThreadServer) -> None:
    code, out = run(
        "send", "staller", "c-1", "hi", "--url", server.url, "--wait", "--timeout", "0.3"
    )
    assert code == 1
    assert "has not settled yet" in one_line_error(out)


@pytest.mark.parametrize("timeout", ["-5", "nan"])
def test_send_refuses_a_negative_or_nan_timeout_before_sending(
    server: ThreadServer, timeout: str
) -> None:
    code, out = run(
        "send", "echo", "c-1", "hi", "--url", server.url, "--wait", "--timeout", timeout
    )
    assert code == 2 and "--timeout must be 0 or more seconds" in one_line_error(out)
    code, out = run("tail", "echo", "c-1", "--url", server.url, "--no-follow")
    assert code == 1 and "no conversation" in one_line_error(out)  # nothing was admitted


def test_send_wait_json_prints_a_failed_outcome_as_json_too(server: ThreadServer) -> None:
    """A script asking for JSON got nothing on stdout when the submission did not complete."""
    code, _ = run("send", "staller", "c-9", "hi", "--url", server.url, "--idempotency-key", "k")
    assert code == 0
    with server.client() as http:
        assert http.post("/agents/staller/c-9/abort").json()["aborted"]
    code, out = run(
        "send", "staller", "c-9", "hi", "--url", server.url, "--idempotency-key", "k",
        "--wait", "--json", "--timeout", "10",
    )  # fmt: skip
    assert code == 1
    shown = json.loads(out.strip().splitlines()[-1])
    assert shown["outcome"] == "aborted" and shown["error"]["type"] == "aborted"
    assert shown["submission_id"].startswith("s_")


def test_tail_prints_the_stream(server: ThreadServer) -> None:
    run("send", "echo", "c-1", "hello", "--url", server.url, "--wait")
    code, out = run("tail", "echo", "c-1", "--url", server.url, "--no-follow")
    assert code == 0
    assert "conversation_created" in out and "submission_settled" in out
    code, out = run(
        "tail", "echo", "c-1", "--url", server.url, "--no-follow", "--json", "--offset", "0"
    )
    records = [json.loads(line) for line in out.splitlines()]
    assert records[0]["offset"] == 1 and records[-1]["type"] == "submission_settled"


def test_tail_follows_live_until_interrupted(server: ThreadServer) -> None:
    run("send", "streamer", "c-1", "hello", "--url", server.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hearth", "tail", "streamer", "c-1", "--url", server.url, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        text=True,
    )
    try:
        assert proc.stdout is not None
        types = []
        for line in proc.stdout:
            types.append(json.loads(line)["type"])
            if types[-1] == "submission_settled":
                break
        assert types[0] == "conversation_created"
        assert types.count("assistant_text_delta") > 1
    finally:
        proc.terminate()
        proc.wait(5)


def test_inspect_shows_submissions_leases_and_stuck_work(server: ThreadServer) -> None:
    run("send", "staller", "c-1", "hi", "--url", server.url)
    run("send", "echo", "c-2", "hi", "--url", server.url, "--wait")
    time.sleep(0.2)
    code, out = run("inspect", "--url", server.url)
    assert code == 0
    assert "running" in out and "settled" in out and "lease s_" in out and "no stuck work" in out
    code, out = run("inspect", "--url", server.url, "--json")
    assert json.loads(out)["counts"]["running"] == 1
    code, out = run("inspect", "--url", server.url, "--conversation", "echo/c-2")
    assert code == 0 and "settled" in out


@pytest.mark.parametrize("conversation", ["echo/nope", "nosuch/c-1"])
def test_inspect_of_a_conversation_that_does_not_exist_says_so(
    server: ThreadServer, conversation: str
) -> None:
    """It printed empty tables and exited 0: read as nothing stuck there, for a name mistyped."""
    code, out = run("inspect", "--url", server.url, "--conversation", conversation)
    assert code != 0 and f"no conversation '{conversation}'" in out, out


def test_migrate_creates_the_schema_and_reports_a_busy_file(
    tmp_path: Path, server: ThreadServer
) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    code, out = run("migrate", "--db", url)
    assert code == 0 and f"created {url} (schema version {SCHEMA_VERSION})" in out
    assert (tmp_path / "new.db").exists()
    code, out = run("migrate", "--db", url)
    assert code == 0 and f"is current (schema version {SCHEMA_VERSION})" in out
    with sqlite3.connect(tmp_path / "new.db") as conn:  # as an older release left it
        conn.execute("ALTER TABLE submissions DROP COLUMN releases")
        conn.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    conn.close()
    code, out = run("migrate", "--db", url)
    assert code == 0 and f"from schema version 9 to {SCHEMA_VERSION}" in out
    code, out = run("migrate", "--db", str(server.app.settings.db))
    assert code == 1
    # (the server runs in this test's process: a server of its own is "another process")
    assert "is open in this process already" in one_line_error(out)


def test_client_errors_are_one_line(server: ThreadServer) -> None:
    code, out = run("send", "nobody", "c-1", "hi", "--url", server.url)
    assert code == 1 and "no agent named 'nobody'" in one_line_error(out)
    code, out = run("send", "echo", "bad id", "hi", "--url", server.url)
    assert code == 1 and "must match" in one_line_error(out)
    code, out = run("send", "echo", "c-1", "hi", "--url", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "cannot reach" in one_line_error(out)
    code, out = run("tail", "echo", "never", "--url", server.url, "--no-follow")
    assert code == 1 and "no conversation" in one_line_error(out)
    # Each of these was a traceback.
    code, out = run("send", "echo", "c-1", "hi", "--url", "http://[::1")
    assert code == 1 and "URL is not usable" in one_line_error(out)
    code, out = run("send", "echo", "c-1", "hi", "--url", server.url, "--token", "s\u00e9cret")
    assert one_line_error(out).endswith(
        "token must be printable ASCII: it goes in an HTTP header (--token, HEARTH_TOKEN)"
    )
    assert code == 1
    code, out = run("send", "echo", "c-1", "caf\udce9", "--url", server.url)  # argv not UTF-8
    assert code == 1 and "not UTF-8" in one_line_error(out)
    code, out = run("resolve", "echo", "c-1", "w_1", '"\\ud800"', "--url", server.url)
    assert code == 1 and "surrogate" in one_line_error(out)


def test_tail_of_a_server_nobody_answers_is_one_line_not_a_silent_wait() -> None:
    """``hearth tail`` with nothing listening (or a host that does not resolve) printed nothing
    and reconnected for ever; the other commands say so in one line."""
    for url in (f"http://127.0.0.1:{free_port()}", "http://no-such-host.invalid:8000"):
        done = subprocess.run(
            [sys.executable, "-m", "hearth", "tail", "echo", "c-1", "--url", url],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=60,
            check=False,
        )
        assert done.returncode == 1 and "cannot reach" in one_line_error(done.stderr), url


def test_send_wait_timeout_bounds_the_admission_to_a_server_that_stopped_answering(
    tmp_path: Path,
) -> None:
    """``hearth send --wait --timeout 2`` to a frozen server took 30 s: the admission waited
    for the client's own default timeout; only the read had the 2 s."""
    server = ServerProcess(tmp_path / "h.db").start()
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        command = [sys.executable, "-m", "hearth", "send", "echo", "c-1", "hi", "--wait"]
        done = subprocess.run(
            [*command, "--timeout", "2", "--url", server.url],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=20,  # (it took 30.5 s)
            check=False,
        )
        assert done.returncode == 1 and "may have been admitted" in one_line_error(done.stderr)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.kill()


@pytest.mark.parametrize("kind", ["unavailable", "shutting_down"])
def test_tail_of_a_server_that_answers_503_waits_for_it(tmp_path: Path, kind: str) -> None:
    """Its check that a server answers took a 503 (the database away, a restart draining it)
    for a server nobody reaches, and quit; the stream waits for such a server."""
    with answering(503, kind, "the database is away, or the server drains") as url:
        command = [sys.executable, "-m", "hearth", "tail", "echo", "c-1", "--url", url]
        with pytest.raises(subprocess.TimeoutExpired):  # still following, not gone with rc 1
            subprocess.run(command, capture_output=True, env=child_env(), timeout=4, check=False)


def test_tail_names_its_offset_option_when_the_offset_is_out_of_range(
    server: ThreadServer,
) -> None:
    """It answered with the server's own wording: "Last-Event-ID must be an integer", for an
    integer given as --offset."""
    for offset in ("-5", "999999999999999999999"):
        code, out = run("tail", "echo", "c-1", "--offset", offset, "--url", server.url)
        assert code == 2 and "Invalid value for '--offset'" in out, out


def test_commands_on_a_database_file_that_is_not_there_make_none(tmp_path: Path) -> None:
    """``hearth waits --db`` (and resolve, gc) with a mistyped path made an empty database."""
    missing = tmp_path / "typo.db"
    for args in (
        ("waits", "--db", f"sqlite:///{missing}"),
        ("resolve", "a", "c", "w_1", "true", "--db", str(missing)),
        ("gc", "--db", str(missing)),
    ):
        code, out = run(*args)
        assert code == 1 and "there is no database at" in one_line_error(out), (args, out)
    assert not missing.exists()


def test_commands_on_another_programs_sqlite_file_refuse_it_unchanged(tmp_path: Path) -> None:
    """``hearth waits --db`` (and gc, resolve) refused it, but had switched it to WAL mode."""
    other = tmp_path / "inventory.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO items (name) VALUES ('teapot')")
    conn.close()
    before = other.read_bytes()
    for args in (
        ("waits", "--db", str(other)),
        ("gc", "--db", str(other), "--dry-run"),
        ("resolve", "a", "c", "w_1", "true", "--db", str(other)),
    ):
        code, out = run(*args)
        assert code == 1 and "holds no hearth database" in one_line_error(out), (args, out)
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.db"]


def test_a_sqlite_uri_as_the_database_is_refused_in_one_line(tmp_path: Path) -> None:
    """SQLite read ``file:...`` as its own URI: ``?mode=memory`` served a database that was
    never written to disk, and ``hearth waits`` said there was no ``file:/abs/x.db``."""
    for db in (f"file:{tmp_path}/h.db?mode=memory", f"sqlite:///file:{tmp_path}/h.db"):
        for command in (("migrate",), ("serve", "serverapp:app", "--port", "0")):
            code, out = run(*command, "--db", db)
            args = (*command, db)
            assert code == 1 and "is a SQLite URI" in one_line_error(out), (args, out)
            assert "sqlite:///path" in out
    assert list(tmp_path.iterdir()) == []


def test_commands_on_a_postgresql_schema_that_is_not_there_make_none(pg_cluster: Cluster) -> None:
    """The SQLite check did not cover PostgreSQL: ``?schema=`` mistyped, each command created the
    schema with its ten tables and reported nothing to do (``hearth check`` passed, exit 0)."""
    url = pg_cluster.url("typo_schema")
    for args in (
        ("waits", "--db", url),
        ("resolve", "a", "c", "w_1", "true", "--db", url),
        ("gc", "--db", url),
    ):
        code, out = run(*args)
        assert code == 1 and "no hearth database in the schema" in one_line_error(out), (args, out)
    checked = run("check", "serverapp:app", "--app-dir", str(HERE), "--db", url)
    assert checked[0] == 2 and "no hearth database" in checked[1], checked
    found = pg_cluster.sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'typo_schema'")
    assert found == "0"


def test_serve_errors_are_one_line(tmp_path: Path) -> None:
    code, out = run("serve", "no_such_module:app", "--db", str(tmp_path / "h.db"))
    assert code == 1 and "cannot import 'no_such_module'" in one_line_error(out)
    code, out = run("serve", ".serverapp:app", "--db", str(tmp_path / "h.db"))
    assert code == 1 and "not a relative module" in one_line_error(out)
    code, out = run("serve", "serverapp:AGENTS", "--db", str(tmp_path / "h.db"))
    assert code == 1 and "is not a hearth.App" in one_line_error(out)
    code, out = run("serve", "serverapp:app", "--db", "mysql://nope", "--port", "0")
    assert code == 1 and "unsupported database URL" in one_line_error(out)


def test_serve_on_a_port_in_use_or_a_bad_host_is_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    """It was uvicorn's own error line (exit 3), after the runtime had opened the database and
    started claiming work."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        db = tmp_path / "h.db"
        code, out = run("serve", "serverapp:app", "--db", str(db), "--port", port)
        assert code == 1 and f"port {port} on 127.0.0.1 is in use" in one_line_error(out)
    code, out = run("serve", "serverapp:app", "--db", str(db), "--host", "999.1.1.1")
    assert code == 1 and "cannot listen on 999.1.1.1" in one_line_error(out)
    # --port 0 skipped the check: the runtime started (and claimed work), then uvicorn failed.
    code, out = run("serve", "serverapp:app", "--db", str(db), "--host", "192.0.2.1", "--port", "0")
    assert code == 1 and "cannot listen on 192.0.2.1:0" in one_line_error(out)
    assert not db.exists()  # nothing was started


def test_serve_with_a_token_and_python_dash_m(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "h.db", args=("--token", "abc")).start()
    try:
        code, out = run("send", "echo", "c-1", "hi", "--url", server.url)
        assert code == 1 and "bearer token" in one_line_error(out)
        code, out = run(
            "send", "echo", "c-1", "hi", "--url", server.url, "--token", "abc", "--wait"
        )
        assert code == 0 and "echo: hi" in out
    finally:
        server.kill()


@pytest.mark.crash
def test_demo_shows_a_crash_and_a_recovery(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hearth", "demo"],
        capture_output=True,
        text=True,
        env=child_env(TMPDIR=str(tmp_path)),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - started < 30
    out = proc.stdout
    assert "SIGKILL" in out and "restarted" in out
    assert out.count("✓") == 4 and "✗" not in out
    assert "step 1 ran once" in out and "interrupted" in out
    assert "hearth tail shop order-1" in out
    assert str(tmp_path) in out  # the database path, to look at later


def test_what_users_wrote_is_printed_as_text_not_markup_or_terminal_codes() -> None:
    """A wait's prompt with "[/]" made ``hearth waits`` raise MarkupError; "Grant [admin] role"
    showed as "Grant  role"; an ESC sequence in it cleared the screen of the person approving.
    ``hearth tail`` printed a model's escape codes as they came."""
    from rich.console import Console
    from rich.table import Table

    from hearth.cli import _add_row, describe

    table = Table("prompt", "type")
    _add_row(table, "Grant [admin] role to [bold]bob? [/]", "push\x1b[2J\x1b]0;pwned\x07")
    console = Console(record=True, width=200, color_system=None)
    console.print(table)
    shown = console.export_text()
    assert "Grant [admin] role to [bold]bob? [/]" in shown
    assert "\x1b" not in shown and "push\\x1b[2J\\x1b]0;pwned\\x07" in shown
    line = describe({"type": "assistant_text_delta", "offset": 3, "delta": "hi\x1b[8m\u202e"})
    console.print(line)
    assert "hi\\x1b[8m\\u202e" in console.export_text()


@contextlib.contextmanager
def logging_as_it_was() -> Iterator[None]:
    """The levels and handlers of the loggers ``logs.configure`` sets, put back after."""
    import logging

    loggers = [logging.getLogger(name) for name in ("hearth", "psycopg", "")]
    saved = [(logger.level, list(logger.handlers)) for logger in loggers]
    try:
        yield
    finally:
        for logger, (level, handlers) in zip(loggers, saved, strict=True):
            logger.setLevel(level)
            logger.handlers[:] = handlers


def test_the_log_level_is_checked_and_sets_hearths_own_lines_in_either_format() -> None:
    """A bad ``--log-level`` was a traceback (KeyError), ``trace`` one too in JSON format, and in
    text format hearth's info lines never showed whatever the level."""
    import logging

    from hearth import logs

    code, out = run("serve", "serverapp:app", "--log-level", "nope", "--port", "0")
    assert code == 2 and "Invalid value for '--log-level'" in out
    with logging_as_it_was():
        config = logs.configure("json", "trace")
        assert config is not None and config["loggers"]["uvicorn"]["level"] == logs.TRACE
        assert logs.configure("text", "info") is None
        hearth_log = logging.getLogger("hearth")
        assert hearth_log.getEffectiveLevel() == logging.INFO
        assert any(getattr(h, "_hearth_text", False) for h in hearth_log.handlers)


def test_hearths_text_lines_are_printed_once_when_the_application_configured_logging(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An app module that called ``logging.basicConfig`` got each of hearth's lines twice
    under ``hearth serve``: from hearth's own handler and from the root's."""
    import logging

    from hearth import logs

    heard: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            heard.append(record.getMessage())

    with logging_as_it_was():
        root = logging.getLogger()
        root.handlers[:] = []
        logs.configure("text", "warning")
        logging.getLogger("hearth.test").warning("alone")
        logging.getLogger("psycopg.pool").warning("discarding closed connection")
        err = capsys.readouterr().err  # nobody else prints them: hearth does, with their names
        assert "hearth.test: alone" in err
        assert "WARNING:     psycopg.pool: discarding closed connection" in err
        root.addHandler(Heard())  # what logging.basicConfig does
        logging.getLogger("hearth.test").warning("configured")
        assert "configured" not in capsys.readouterr().err and heard == ["configured"]


def test_json_lines_are_written_once_when_the_application_configured_logging(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With ``--log-format json`` an app module that called ``logging.basicConfig`` got each
    line twice: once in its own format (not JSON), once as JSON. Its console handler writes
    JSON now; a handler of its own to a file keeps its format."""
    import logging
    import sys

    from hearth import logs

    with logging_as_it_was():
        root = logging.getLogger()
        root.handlers[:] = []
        console = logging.StreamHandler(sys.stderr)  # what logging.basicConfig makes
        console.setFormatter(logging.Formatter("APP %(name)s %(message)s"))
        to_file = logging.FileHandler(tmp_path / "app.log")
        to_file.setFormatter(logging.Formatter("APP %(name)s %(message)s"))
        root.addHandler(console)
        root.addHandler(to_file)
        logs.configure("json", "warning")
        logs.configure("json", "warning")  # (configured again, as --reload does)
        logging.getLogger("hearth.test").warning("once")
        to_file.close()
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert [json.loads(line)["message"] for line in lines] == ["once"]
        assert (tmp_path / "app.log").read_text() == "APP hearth.test once\n"


@pytest.mark.parametrize("option", ["--token", "--host"])
def test_serve_refuses_an_empty_token_or_host_in_one_line(
    tmp_path: Path, option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hearth serve --token "$TOKEN"`` with TOKEN unset served every route without a token,
    even over HEARTH_TOKEN; ``--host ""`` with ``--port 0`` listened on every interface."""
    monkeypatch.setenv("HEARTH_TOKEN", "secret")
    db = tmp_path / "h.db"
    code, out = run("serve", "serverapp:app", "--db", str(db), "--port", "0", option, "")
    assert code == 1 and f"{option[2:]} is empty" in one_line_error(out)
    assert not db.exists()


def test_serve_with_an_empty_token_option_names_the_option_in_a_new_process(
    tmp_path: Path,
) -> None:
    """Given to the module's environment while it made its App, ``--token ""`` was blamed on
    ``HEARTH_TOKEN`` (in this process the module was imported before, and made no App)."""
    serve = [sys.executable, "-m", "hearth", "serve", "serverapp:app"]
    done = subprocess.run(
        [*serve, "--db", str(tmp_path / "h.db"), "--port", "0", "--token", ""],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    line = one_line_error(done.stderr)
    assert done.returncode == 1 and "token is empty" in line and "HEARTH_TOKEN" not in line


def test_serve_takes_its_options_over_bad_variables_while_the_app_is_made(tmp_path: Path) -> None:
    """The module's ``App(...)`` read the environment before ``--token`` was applied: an empty
    ``HEARTH_TOKEN`` (or ``HEARTH_PORT=abc``) refused to start although the option gave the
    value. The option wins over its variable, as documented; the variable is as it was after."""
    server = ServerProcess(
        tmp_path / "h.db",
        env={"HEARTH_TOKEN": "", "HEARTH_WORKERS": "many"},
        args=("--token", "s3cret", "--workers", "4"),
    ).start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            assert http.get("/metrics").status_code == 401
            good = {"authorization": "Bearer s3cret"}
            assert http.get("/metrics", headers=good).status_code == 200
    finally:
        server.kill()


@pytest.mark.parametrize("access_log", [False, True])
def test_serve_reload_serves_as_serve_does(tmp_path: Path, access_log: bool) -> None:
    """``--reload`` ran uvicorn's own server: ``--log-format json`` ignored, every request
    logged (``--access-log`` or not) with the token in clear, ``--port 0`` shown as ``:0``."""

    watched = tmp_path / "code"  # what --reload watches: no test files
    watched.mkdir()
    args = ["--reload", "--port", "0", "--app-dir", str(watched), "--token", "secret-token-1"]
    args += ["--log-format", "json", "--log-level", "info"]
    server = ServerProcess(tmp_path / "h.db", args=(*args, *(["--access-log"] * access_log)))
    server.start()
    try:
        url = json.loads(server.ready_line)["url"]  # (a JSON line too, as every line before)
        assert [json.loads(line)["logger"] for line in server.before_ready] == ["hearth.serve"]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), server.ready_line
        with httpx2.Client(base_url=url, timeout=10) as http:
            assert http.get("/healthz", params={"token": "secret-token-1"}).status_code == 200
            bearer = {"Authorization": "Bearer secret-token-1"}
            assert http.get("/waits", params={"t": "secret-token-1"}, headers=bearer).is_success
    finally:
        server.terminate()
        server.wait(30)
    log = server.log.read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]  # JSON, every one
    assert any("Started reloader process" in line["message"] for line in lines)
    assert "secret-token-1" not in log
    requests = [line for line in lines if line["logger"] == "uvicorn.access"]
    if access_log:
        assert any("/healthz?token=[redacted]" in line["message"] for line in requests), log
    else:
        assert requests == [], log


def test_serve_and_check_name_the_modules_own_import_error_in_one_line(tmp_path: Path) -> None:
    """A module that imports a package not installed was "no such module" when the names
    shared a prefix (``zq_agents_api`` importing ``zq_agents``), and ``hearth serve`` printed a
    traceback for any other error of the module's import (a KeyError, say)."""
    (tmp_path / "zq_agents_api.py").write_text("import zq_agents  # not installed\n")
    (tmp_path / "zq_raises.py").write_text("import os\n\nKEY = os.environ['ZQ_NOT_SET']\n")
    expected = {
        "zq_agents_api:app": "ModuleNotFoundError: No module named 'zq_agents'",
        "zq_raises:app": "KeyError: 'ZQ_NOT_SET'",
    }
    where = ["--app-dir", str(tmp_path), "--db", str(tmp_path / "h.db")]
    for command, code in (("serve", 1), ("check", 2)):
        for ref, error in expected.items():
            port = ["--port", "0"] if command == "serve" else []
            done = subprocess.run(
                [sys.executable, "-m", "hearth", command, ref, *where, *port],
                capture_output=True,
                text=True,
                env=child_env(),
                timeout=60,
            )
            assert done.returncode == code, (command, ref, done.stderr)
            assert one_line_error(done.stdout + done.stderr) == (
                f"hearth: cannot import {ref}: {error}"
            )
    assert not (tmp_path / "h.db").exists()


@pytest.mark.parametrize("command", ["serve", "check"])
def test_an_app_dir_that_does_not_exist_is_named_as_such(tmp_path: Path, command: str) -> None:
    """It was "no such module" for a module that may well be there, in the folder meant."""
    missing = tmp_path / "nowhere"
    code, out = run(command, "serverapp:app", "--app-dir", str(missing))
    assert code == 2 and "'--app-dir'" in out and "does not exist" in out, out


def test_client_commands_reach_a_server_on_an_ipv6_hearth_host(
    serve_app: Callable[..., ThreadServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HEARTH_HOST=::1`` made the default URL ``http://::1:PORT``: every command failed."""
    server = serve_app(host="::1")
    monkeypatch.setenv("HEARTH_HOST", "::1")
    monkeypatch.setenv("HEARTH_PORT", server.url.rpartition(":")[2])
    code, out = run("send", "echo", "c-1", "hello", "--wait")
    assert code == 0 and out.strip().endswith("echo: hello"), out


def test_tail_into_a_reader_that_went_away_ends_quietly(server: ThreadServer) -> None:
    """``hearth tail | head`` ended with "[Errno 32] Broken pipe" on stderr."""
    import os

    run("send", "echo", "c-1", "hello", "--url", server.url, "--wait")
    tail = [sys.executable, "-m", "hearth", "tail", "echo", "c-1", "--url", server.url]
    for printed_as in (["--no-follow"], ["--no-follow", "--json"]):  # by rich, or by click
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before the first line
        try:
            done = subprocess.run(
                [*tail, *printed_as],
                stdout=write_end,
                stderr=subprocess.PIPE,
                env=child_env(),
                text=True,
                timeout=60,
            )
        finally:
            os.close(write_end)
        assert (done.returncode, done.stderr) == (1, ""), printed_as


def test_the_help_says_what_each_db_option_does_and_names_hearth_token() -> None:
    assert "Read this database directly" in run("waits", "--help")[1]
    assert "Write to this database directly" in run("resolve", "--help")[1]
    assert "(HEARTH_TOKEN)" in run("serve", "--help")[1]


def test_the_ready_line_is_a_json_line_with_log_format_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It stayed plain text among the JSON lines."""
    import hearth
    from hearth.cli import _ready

    app = hearth.App([], db="memory", log_format="json")
    _ready(app)("http://127.0.0.1:8000")
    [line] = capsys.readouterr().out.splitlines()
    data = json.loads(line)
    assert data["level"] == "info" and data["logger"] == "hearth.serve"
    assert data["message"].startswith("hearth: serving http://127.0.0.1:8000")
    assert (data["url"], data["agents"], data["db"]) == ("http://127.0.0.1:8000", [], "memory")
    _ready(hearth.App([], db="memory"))("http://127.0.0.1:8000")
    assert capsys.readouterr().out.startswith("hearth: serving http://127.0.0.1:8000 (agents: ;")


@contextlib.contextmanager
def dropping_answers(url: str) -> Iterator[str]:
    """A proxy to ``url`` that passes each request on and hangs up without its answer, as a
    server that dies right after committing, or a broken link, leaves a client."""
    import socket
    import threading
    from urllib.parse import urlsplit

    target = urlsplit(url)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def one(client: socket.socket) -> None:
        with client, socket.create_connection((target.hostname, target.port), 10) as upstream:
            client.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += client.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")),
                0,
            )  # fmt: skip
            while len(body) < length:
                body += client.recv(65536)
            upstream.sendall(head + b"\r\n\r\n" + body)
            upstream.settimeout(10)
            assert upstream.recv(65536).startswith(b"HTTP/1.1 ")  # answered, and dropped

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            one(client)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def test_send_whose_answer_is_lost_says_the_message_may_have_been_admitted(
    server: ThreadServer,
) -> None:
    """A connection broken after the request went out said only "the connection to the server
    failed", though the message was admitted: a user sent it again, and it ran twice."""
    with dropping_answers(server.url) as url:
        code, out = run("send", "echo", "c-lost", "hi", "--url", url, "--idempotency-key", "k1")
        line = one_line_error(out)
        assert code == 1 and "may have been admitted" in line and "--idempotency-key k1" in line
        code, out = run("send", "echo", "c-lost", "hi", "--url", url, "--wait")
        line = one_line_error(out)
        assert code == 1 and "may have been admitted" in line and "hearth tail" in line
    with server.client() as http:
        texts = [r["content"] for r in http.get("/agents/echo/c-lost/stream").json()["records"]
                 if r["type"] == "user_message"]  # fmt: skip
    assert texts == ["hi", "hi"]  # both were admitted, as the lines said they may have been
    code, out = run("send", "echo", "c-none", "hi", "--url", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "may have been" not in one_line_error(out)  # (nothing was sent)


def test_send_wait_json_has_the_same_fields_for_every_outcome(server: ThreadServer) -> None:
    code, out = run("send", "echo", "c-j", "hi", "--url", server.url, "--wait", "--json")
    shown = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and shown["outcome"] == "completed" and shown["reply"] == "echo: hi"


def test_tail_to_a_terminal_that_is_not_utf8_escapes_what_it_cannot_show(
    server: ThreadServer,
) -> None:
    """With an ASCII or Latin-1 stdout, ``hearth tail`` stopped at the first record it could
    not print, blaming the token ("must be ASCII") or the arguments."""
    run("send", "echo", "c-enc", "café ☕ 東京", "--url", server.url, "--wait")
    for encoding in ("ascii", "latin-1"):
        done = subprocess.run(
            [sys.executable, "-m", "hearth", "tail", "echo", "c-enc", "--no-follow",
             "--url", server.url],
            capture_output=True,
            env={**child_env(), "PYTHONIOENCODING": encoding},
            timeout=60,
            check=False,
        )  # fmt: skip
        shown = done.stdout.decode(encoding)
        assert done.returncode == 0, done.stderr
        assert "\\u2615" in shown and "submission_settled completed" in shown, shown


def test_an_empty_id_or_name_is_refused_before_any_request(server: ThreadServer) -> None:
    """An empty id reached another route: 404 "no route", and an empty wait id a redirect the
    SDK took for a server that is not hearth's."""
    import hearth

    with hearth.Client(server.url) as client:
        for make in (
            lambda: client.conversation("echo", ""),
            lambda: client.conversation("", "c-1"),
            lambda: client.conversation("echo", "c-1").resolve("", True),
            lambda: client.conversation("echo", "c-1").read(""),
        ):
            with pytest.raises(hearth.errors.InvalidId, match="is empty") as caught:
                make()
            assert caught.value.status is None and caught.value.type == "invalid_id"  # type: ignore[attr-defined]
    code, out = run("send", "echo", "", "hi", "--url", server.url)
    assert code == 1 and "conversation id is empty" in one_line_error(out)
    code, out = run("resolve", "echo", "c-1", "", "true", "--url", server.url)
    assert code == 1 and "wait id is empty" in one_line_error(out)


def test_a_token_no_header_can_carry_is_refused_by_the_sdk_as_invalid_input() -> None:
    import hearth

    for token in ("sécret", "two\nlines"):
        with pytest.raises(hearth.errors.InvalidInput, match="printable ASCII") as caught:
            hearth.Client("http://127.0.0.1:9", token=token)
        assert caught.value.status is None  # type: ignore[attr-defined]
        with pytest.raises(hearth.errors.InvalidInput, match="printable ASCII"):
            hearth.AsyncClient("http://127.0.0.1:9", token=token)


def test_serve_reload_names_a_broken_change_in_one_line(tmp_path: Path) -> None:
    """An edit that broke the module's import printed a multiprocessing traceback."""
    watched = tmp_path / "code"
    watched.mkdir()
    module = watched / "reloadme.py"
    module.write_text((HERE / "serverapp.py").read_text())
    args = ("--reload", "--port", "0", "--app-dir", str(watched))
    server = ServerProcess(tmp_path / "h.db", app="reloadme:app", args=args).start()
    try:
        time.sleep(0.5)
        module.write_text("def broken(:\n")
        deadline = time.monotonic() + 30
        while "cannot import" not in server.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(30)
    log = server.log.read_text()
    assert "hearth: cannot import reloadme:app: SyntaxError" in log, log
    assert "Traceback" not in log, log
