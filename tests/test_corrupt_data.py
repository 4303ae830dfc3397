"""Data changed outside hearth or damaged on disk: the work that needs it fails, clearly and once;
the rest goes on.

Before, one submission row whose payload was not JSON stopped every claim of a SQLite server
(each claim decoded it, failed, and rolled back; the next took the same oldest row first), and a
record body that was not JSON made the submission of its conversation spin through releases and
retries past ``max_attempts``, never settling, while every read of it answered 503
"unavailable"."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import hearth
from hearth.errors import CorruptData
from hearth.server.errors import api_error
from hearth.store import NewSubmission, SQLiteStore
from hearth.testing import ScriptedModel, reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@hearth.agent(durability=hearth.Durability(max_attempts=2))
def echo(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/echo")
    return ""


def message(conversation_id: str, text: str) -> NewSubmission:
    return NewSubmission(conversation_id, "echo", "message", {"message": text})


async def admitted(path: Path, *submissions: NewSubmission) -> list[str]:
    store = SQLiteStore(str(path))
    await store.open()
    try:
        return [(await store.admit(s)).submission.id for s in submissions]
    finally:
        await store.close()


def damage(path: Path, sql: str, *args: object) -> None:
    with sqlite3.connect(path) as conn:
        assert conn.execute(sql, args).rowcount == 1
    conn.close()


def app(path: Path) -> hearth.App:
    model = ScriptedModel("echo", lambda request: reply("ok"))
    return hearth.App([echo], db=f"sqlite:///{path}", providers=[model])


async def test_a_submission_whose_row_cannot_be_read_fails_and_the_others_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hearth.db"
    broken, fine = await admitted(path, message("echo/a", "hi"), message("echo/b", "hi"))
    damage(path, 'UPDATE submissions SET payload = \'{"message": "h\' WHERE id = ?', broken)
    async with app(path).run() as rt:
        assert (await rt.read(fine, timeout=10)).text == "ok"
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(broken, timeout=10)
        sub = await rt.submission(broken)
    assert failed.value.type == "corrupt_data"
    assert f"submission {broken}: its payload is not JSON" in str(failed.value)
    assert sub.attempt == 1


async def test_a_record_that_cannot_be_read_fails_its_submission_once(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    (first,) = await admitted(path, message("echo/a", "hi"))
    async with app(path).run() as rt:
        await rt.read(first, timeout=10)
    (second,) = await admitted(path, message("echo/a", "again"))
    damage(
        path, "UPDATE records SET body = '{' WHERE conversation_id = 'echo/a' AND \"offset\" = 1"
    )
    async with app(path).run() as rt:
        with pytest.raises(hearth.SubmissionFailed) as failed:
            await rt.read(second, timeout=10)
        sub = await rt.submission(second)
        with pytest.raises(CorruptData, match="a record of echo/a cannot be read"):
            await rt.history("echo", "a")
    assert failed.value.type == "corrupt_data" and "a record of echo/a" in str(failed.value)
    assert sub.attempt == 1  # failed at once: no attempt could read it
    answer = api_error(CorruptData("a record of echo/a cannot be read"))
    assert (answer.status, answer.type) == (
        500,
        "corrupt_data",
    )  # not "unavailable": no retry helps


def test_hearth_check_says_a_corrupt_record_in_one_line(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "hearth.db"
    asyncio.run(admitted(path, message("echo/a", "hi")))
    damage(path, "UPDATE records SET body = 'not json' WHERE conversation_id = ?", "echo/a")
    (tmp_path / "echoapp.py").write_text(
        "import hearth\n@hearth.agent\ndef echo(ctx):\n    return ''\napp = hearth.App([echo])\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "hearth", "check", "echoapp:app", "--db", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr
    assert "a record of echo/a cannot be read" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


async def test_a_record_that_could_not_be_read_leaves_the_file_free_when_the_store_closes(
    tmp_path: Path,
) -> None:
    """The traceback of the failed read kept its cursor, and with it the file locked after the
    runtime had ended: ``hearth waits --db`` said another process owned it."""
    path = tmp_path / "hearth.db"
    (first,) = await admitted(path, message("echo/a", "hi"))
    async with app(path).run() as rt:
        await rt.read(first, timeout=10)
    damage(
        path, "UPDATE records SET body = '{' WHERE conversation_id = 'echo/a' AND \"offset\" = 2"
    )
    async with app(path).run() as rt:
        with pytest.raises(CorruptData) as raised:
            await rt.history("echo", "a")
    assert raised.value.__traceback__ is not None  # (kept, as a caller's would be)
    again = SQLiteStore(str(path))
    await again.open()  # not "another process owns the SQLite file"
    await again.close()
