"""The SQLite store when the disk fails it: full, or read-only. A small tmpfs mount stands in
for the disk (root mounts it; in CI a missing mount is a failure, elsewhere a skip)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hearth
from hearth.errors import StoreError, StoreUnavailable
from hearth.records import ToolStepSettled
from hearth.store import open_store
from hearth.store.sqlite_writer import FileWatch
from hearth.testing import ScriptedModel, call, calls, reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Disk:
    """A tmpfs of ``size`` mounted on a fresh folder."""

    def __init__(self, size: str) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="hearth-disk-"))
        self._mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.path))

    def _mount(self, *args: str) -> None:
        done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip() or "mount failed")

    def fill(self) -> None:
        """Write a filler file until the disk is full (unbuffered: closing it writes nothing
        more, so it cannot fail whatever space was left)."""
        with open(self.path / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass

    def free(self) -> None:
        (self.path / "filler").unlink()

    def read_only(self) -> None:
        self._mount("-o", "remount,ro", str(self.path))

    def remove(self) -> None:
        subprocess.run(["umount", str(self.path)], capture_output=True, check=False)
        shutil.rmtree(self.path, ignore_errors=True)


@pytest.fixture
def disk() -> Iterator[Disk]:
    try:
        made = Disk("4m")
    except (RuntimeError, OSError) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"cannot mount a tmpfs for the disk-fault tests: {exc}")
        pytest.skip(f"cannot mount a tmpfs (needs root): {exc}")
    try:
        yield made
    finally:
        made.remove()


@hearth.tool(durable=True)
async def job(ctx: hearth.ToolContext) -> str:
    """Three steps, a moment apart."""
    for name in ("one", "two", "three"):
        await ctx.step.do(name, lambda step=name: step)
        await asyncio.sleep(0.4)
    return "done"


def worker_app(db: Path) -> hearth.App:
    def worker(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/worker")
        ctx.use_tool(job)
        return ""

    model = ScriptedModel("worker", [calls(call("job")), reply("all done")], repeat_last=False)
    echo = ScriptedModel("echo", [reply("still here")], repeat_last=True)

    def talker(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/echo")
        return ""

    return hearth.App(
        [hearth.Agent(worker, name="worker"), hearth.Agent(talker, name="talker")],
        db=f"sqlite:///{db}",
        providers=[model, echo],
        lease_s=2,
        heartbeat_s=0.5,
        scan_s=0.5,
    )


async def test_a_full_disk_pauses_admission_and_work_and_both_resume_when_space_returns(
    disk: Disk,
) -> None:
    async with worker_app(disk.path / "h.db").run() as rt:
        receipt = await rt.dispatch("worker", "c1", "go")
        for _ in range(100):
            records = await rt.history("worker", "c1")
            if any(isinstance(r, ToolStepSettled) for r in records):
                break
            await asyncio.sleep(0.05)
        disk.fill()
        with pytest.raises(StoreUnavailable, match="disk is full"):
            await rt.dispatch("talker", "t1", "hello")
        await asyncio.sleep(1.5)  # the running job meets the full disk at its next step
        assert (await rt.submission(receipt.submission_id)).outcome is None  # not settled wrongly
        disk.free()
        reply_ = await rt.read(receipt, timeout=30)
        assert reply_.text == "all done"
        steps = Counter(
            r.step for r in await rt.history("worker", "c1") if isinstance(r, ToolStepSettled)
        )
        assert steps == {"one": 1, "two": 1, "three": 1}
        after = await rt.dispatch("talker", "t1", "hello")
        assert (await rt.read(after, timeout=10)).text == "still here"


async def test_a_database_on_a_read_only_disk_is_one_clear_error_at_start(disk: Disk) -> None:
    store = open_store(f"sqlite:///{disk.path / 'h.db'}")
    await store.open()
    await store.close()
    disk.read_only()
    again = open_store(f"sqlite:///{disk.path / 'h.db'}")
    with pytest.raises(StoreError, match=r"cannot open the SQLite file .*read-only"):
        await again.open()


FILE_SIZE_LIMIT = """
import asyncio, resource, signal
from hearth.errors import StoreUnavailable
from hearth.store import NewSubmission, open_store

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead

async def main(path):
    store = open_store(f"sqlite:///{path}")
    await store.open()
    unlimited = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, unlimited[1]))
    admitted = 0
    try:
        for i in range(10_000):
            await store.admit(NewSubmission(f"a/c{i}", "a", "message", {"m": "x" * 500}))
            admitted += 1
    except StoreUnavailable as exc:
        print("refused:", exc)
    resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)
    await store.admit(NewSubmission("a/after", "a", "message", {"m": "y"}))
    print("admitted", admitted, "then", len(await store.list_submissions(limit=20_000)))
    await store.close()

import sys
asyncio.run(main(sys.argv[1]))
"""


def test_a_file_size_limit_refuses_writes_as_unavailable_and_they_resume_after(
    tmp_path: Path,
) -> None:
    import sys

    src = str(Path(hearth.__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT, str(tmp_path / "h.db")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    refused, counted = done.stdout.strip().splitlines()
    assert refused.startswith("refused:") and "the disk refused a write" in refused
    admitted, total = int(counted.split()[1]), int(counted.split()[3])
    assert 0 < admitted < 10_000
    assert total == admitted + 1  # nothing half-written, and writes resumed


async def test_a_disk_that_fills_while_storing_an_attachment_admits_nothing(disk: Disk) -> None:
    big = os.urandom(6 * 1024 * 1024)  # more than the whole 4 MB disk
    async with worker_app(disk.path / "h.db").run() as rt:
        with pytest.raises(StoreUnavailable, match="disk is full"):
            await rt.dispatch(
                "talker", "t1", "see", attachments=[hearth.Attachment(big, "big.bin")]
            )
        assert await rt.submissions("talker/t1") == []
        assert await rt.store.collect_attachments(dry_run=True) == []
        small = hearth.Attachment(b"small enough", "note.txt")
        after = await rt.dispatch("talker", "t1", "see", attachments=[small])
        assert (await rt.read(after, timeout=10)).text == "still here"
        stored = await rt.attachment(small.sha256)
        assert stored.data == b"small enough" and stored.media_type == "text/plain"


def test_a_full_disk_is_a_503_over_http_and_admits_nothing(disk: Disk) -> None:
    """The same with a real ``hearth serve`` process: the file is refused with a 503, and the
    server admits the next (smaller) one once it fits."""
    import sys

    import httpx2

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
    from httpharness import ServerProcess

    server = ServerProcess(disk.path / "h.db", log=Path(tempfile.mkdtemp()) / "server.log")
    server.start()
    try:
        url = f"{server.url}/agents/echo/c-1"
        big = {"file": ("big.bin", os.urandom(6 * 1024 * 1024), "application/octet-stream")}
        refused = httpx2.post(url, data={"message": "x"}, files=big, timeout=30)
        assert refused.status_code == 503, refused.text
        assert "disk is full" in refused.json()["error"]["message"]
        small = {"file": ("note.txt", b"fits", "text/plain")}
        taken = httpx2.post(url, data={"message": "x"}, files=small, timeout=30)
        assert taken.status_code == 202, taken.text
    finally:
        server.kill()

    async def check() -> tuple[int, list[Any]]:
        store = open_store(f"sqlite:///{disk.path / 'h.db'}")
        await store.open()
        try:
            return len(await store.list_submissions()), await store.collect_attachments(
                dry_run=True
            )
        finally:
            await store.close()

    subs, orphans = asyncio.run(check())
    assert subs == 1 and orphans == []


# --- the files renamed away under a running process -------------------------------------------


def _message(conversation_id: str) -> Any:
    from hearth.store import NewSubmission

    return NewSubmission(conversation_id, "support", "message", {"message": "hi"})


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_database_file_deleted_or_replaced_under_the_process_takes_no_more_writes(
    tmp_path: Path, how: str
) -> None:
    """SQLite wrote on into the file it had opened: every admission after the file was deleted
    was acknowledged (202) and lost, and a second process could open a new file at the path."""
    path = tmp_path / "hearth.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        await store.admit(_message("support/a"))
        os.unlink(path)
        if how == "replaced":
            path.write_bytes(b"")  # another file by that name
        await asyncio.sleep(FileWatch.EVERY_S + 0.05)  # (a write looks at most this often)
        with pytest.raises(StoreUnavailable, match=f"{path} was deleted or replaced"):
            await store.admit(_message("support/b"))
        with pytest.raises(StoreUnavailable, match="was deleted or replaced"):
            await store.ping(1.0)  # /healthz: 503
        assert await store.get_conversation("support/a") is not None  # reads go on
    finally:
        await store.close()


_WAL_SCRIPT = """
import asyncio, os, signal, sys
from hearth.store import NewSubmission, open_store

async def main(path):
    store = open_store("sqlite:///" + path)
    await store.open()
    await store.admit(NewSubmission("support/a", "support", "message", {"message": "hi"}))
    os.unlink(path + "-wal")  # what holds a's admission, not yet copied into the database
    await asyncio.sleep(0.2)  # (a write looks at most every 0.1 s)
    await store.admit(NewSubmission("support/b", "support", "message", {"message": "hi"}))
    print("acknowledged", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main(sys.argv[1]))
"""


def test_a_wal_deleted_under_the_process_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Both admissions were lost: the first lived in the WAL that lost its name, the second was
    written on into it; a crash took the WAL, unnamed, with the process."""
    path = tmp_path / "hearth.db"
    script = tmp_path / "wal.py"
    script.write_text(_WAL_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=60
    )
    assert "acknowledged" in done.stdout, done.stderr
    assert done.returncode == -9
    assert "the WAL of" in done.stderr  # said in the log

    async def found() -> list[str]:
        store = open_store(f"sqlite:///{path}")
        await store.open()
        try:
            return [c.conversation_id for c in await store.list_conversations()]
        finally:
            await store.close()

    assert sorted(asyncio.run(found())) == ["support/a", "support/b"]
