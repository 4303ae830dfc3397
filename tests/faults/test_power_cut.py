"""A power cut under ``hearth serve`` on SQLite: what was acknowledged must survive it.

The database lives on ``tests/apps/lazyfs.py``, a FUSE file system that keeps every write not
yet fsynced in its own memory. The cut SIGKILLs the server and then the file system (its memory,
every unsynced write, is gone), remounts the backing folder and restarts the server. Every
admission answered 202 and every durable step whose ``step.do`` returned must still be there.

The control runs the same with ``?synchronous=OFF`` (SQLite never fsyncs): it must lose
acknowledged work, which shows that the cut really drops unsynced writes and the check sees it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from faultkit import APPS, FAST_LEASES, acks, missing, on_store, serve
from httpharness import ServerProcess, wait_until

from hearth.records import ToolStepSettled
from hearth.testing.invariants import ToolLog, assert_invariants
from hearth.testing.toollog import tool_runs

pytestmark = pytest.mark.crash


class LazyDisk:
    """``lazyfs.py`` serving ``backing`` at ``mount`` in its own process."""

    def __init__(self, root: Path) -> None:
        self.backing, self.mount = root / "backing", root / "mnt"
        self.backing.mkdir()
        self.mount.mkdir()
        self.log = root / "lazyfs.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LazyDisk:
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(APPS / "lazyfs.py"), str(self.backing), str(self.mount)],
                stderr=log,
            )
        wait_until(lambda: os.path.ismount(self.mount) or self._died(), 20)
        if self._died():
            raise RuntimeError(f"lazyfs did not mount:\n{self.log.read_text()[-2000:]}")
        return self

    def _died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def unsynced(self) -> str:
        """Ask the file system what it holds back (printed to its log)."""
        assert self.proc is not None
        before = self.log.read_text().count("unsynced:")
        self.proc.send_signal(signal.SIGUSR1)
        os.stat(self.mount)  # the report runs on the file system's next request
        wait_until(lambda: self.log.read_text().count("unsynced:") > before, 10)
        return self.log.read_text().split("unsynced:")[-1].splitlines()[0].strip()

    def cut(self) -> None:
        """The power goes: the file system's memory is lost, then the dead mount is removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        # A dead FUSE mount no longer looks like a mount to stat: unmount it regardless.
        subprocess.run(["umount", "-l", str(self.mount)], check=False, capture_output=True)


@pytest.fixture
def lazy_disk(tmp_path: Path) -> Iterator[LazyDisk]:
    if not os.path.exists("/dev/fuse"):
        missing("/dev/fuse is absent: the power-cut test needs FUSE")
    try:
        import fuse  # type: ignore[import-untyped]  # noqa: F401
    except (ImportError, OSError) as exc:
        missing(f"fusepy cannot load libfuse (apt-get install -y libfuse2): {exc}")
    disk = LazyDisk(tmp_path)
    try:
        disk.start()
    except RuntimeError as exc:
        missing(str(exc))
    try:
        yield disk
    finally:
        disk.cut()


def known(server: ServerProcess, agent: str, conv: str, sid: str, wait: float = 0) -> Any:
    """The submission's view, or None when the server has never heard of it."""
    answer = httpx2.get(
        f"{server.url}/agents/{agent}/{conv}/submissions/{sid}",
        params={"wait": wait},
        timeout=wait + 10,
    )
    if answer.status_code == 404:
        return None
    assert answer.status_code == 200, answer.text
    return answer.json()


def run_until_cut(disk: LazyDisk, tmp_path: Path, sync: str) -> tuple[ServerProcess, Any]:
    """Admit and work, cut the power, restart: the restarted server and what was acknowledged."""
    tool_log, ack_log = tmp_path / "tools.log", tmp_path / "acks.log"
    server = serve(
        disk.mount / "h.db",
        tmp_path / "server.log",
        HEARTH_TEST_LOG=str(tool_log),
        HEARTH_TEST_ACKS=str(ack_log),
        HEARTH_TEST_STEPS="40",
        HEARTH_TEST_STEP_S="0.05",
        HEARTH_CRASH_RUN="0",
        **FAST_LEASES,
    )
    server.db_url = f"sqlite:///{disk.mount / 'h.db'}?synchronous={sync}"
    server.start(timeout=60)
    admitted: dict[str, str] = {}
    job = httpx2.post(f"{server.url}/agents/worker/w1", json={"message": "chores"}, timeout=15)
    assert job.status_code == 202, job.text
    job_id = job.json()["submission_id"]
    for n in range(15):
        answer = httpx2.post(f"{server.url}/agents/echo/e{n}", json={"message": "hi"}, timeout=15)
        assert answer.status_code == 202, answer.text
        admitted[answer.json()["submission_id"]] = f"e{n}"
    wait_until(lambda: len(acks(ack_log)) >= 5, 30)
    held = disk.unsynced()
    server.kill()  # the power goes: first the programs stop...
    steps = {a[3]: a[2] for a in acks(ack_log) if a[0] == "step"}
    disk.cut()  # ...then whatever the kernel had not written is gone
    disk.start()
    server.env["HEARTH_CRASH_RUN"] = "1"
    server.start(timeout=60)
    return server, (job_id, admitted, steps, held, tool_log)


def test_acknowledged_admissions_and_steps_survive_a_power_cut(
    lazy_disk: LazyDisk, tmp_path: Path
) -> None:
    server, (job_id, admitted, steps, _, tool_log) = run_until_cut(lazy_disk, tmp_path, "FULL")
    try:
        lost = [sid for sid, conv in admitted.items() if known(server, "echo", conv, sid) is None]
        assert lost == [], f"{len(lost)} of {len(admitted)} acknowledged admissions were lost"
        job = known(server, "worker", "w1", job_id, wait=90)
        assert job is not None and job["outcome"] == "completed", job
        for sid, conv in admitted.items():
            assert known(server, "echo", conv, sid, wait=30)["outcome"] == "completed"
        server.terminate()
        assert server.wait(30) == 0
    finally:
        server.kill()

    async def check(store: Any) -> list[Any]:
        records = list(await store.read("worker/w1"))
        call_id = next(iter(steps.values()))
        on_disk = {("worker/w1", call_id, name): 0 for name in steps}
        await assert_invariants(store, tool_log=ToolLog(tool_runs(tool_log), on_disk))
        return records

    records = on_store(server.db_url, check)
    recorded = [r.step for r in records if isinstance(r, ToolStepSettled)]
    assert set(steps) <= set(recorded), "an acknowledged step was lost"
    assert sorted(recorded) == sorted(set(recorded))  # and none recorded twice


def test_the_cut_loses_acknowledged_work_when_sqlite_does_not_fsync(
    lazy_disk: LazyDisk, tmp_path: Path
) -> None:
    """The control: without fsync, the same run loses what it acknowledged, and the checks of
    the test above see it."""
    server, (job_id, admitted, steps, held, _) = run_until_cut(lazy_disk, tmp_path, "OFF")
    try:
        assert not held.startswith("0 files"), held  # there was something to drop
        lost = [sid for sid, conv in admitted.items() if known(server, "echo", conv, sid) is None]
        job_known = known(server, "worker", "w1", job_id) is not None
        server.kill()
    finally:
        server.kill()

    async def recorded_steps(store: Any) -> set[str]:
        return {r.step for r in await store.read("worker/w1") if isinstance(r, ToolStepSettled)}

    lost_steps = set(steps) - on_store(server.db_url, recorded_steps)
    assert lost or lost_steps or not job_known, "nothing acknowledged was lost without fsync"
