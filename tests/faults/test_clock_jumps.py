"""Wall-clock jumps under a running ``hearth serve``, made with Debian's libfaketime.

The server runs with libfaketime preloaded, its wall clock read from a file the test rewrites
mid-run (``FAKETIME_NO_CACHE``), its monotonic clock left real (``FAKETIME_DONT_FAKE_MONOTONIC``).
Leases and deadlines must not move with the wall clock: on SQLite the store's clock is the wall
clock read once at start and advanced by the monotonic clock; on PostgreSQL processes compare with
the database's clock. (libfaketime 0.9.10 breaks ``time.sleep`` when the monotonic clock is not
faked; the server never calls it.) Which clock each comparison uses: ``docs/clocks.md``.
"""

from __future__ import annotations

import glob
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from faultkit import FAST_LEASES, acks, missing, on_store, serve
from httpharness import ServerProcess, wait_until

from hearth.records import Record, SubmissionSettled, ToolOutcome
from hearth.testing.invariants import assert_invariants

pytestmark = pytest.mark.crash

JUMP = 5 * 3600  # five hours


class FakeClock:
    """The environment that puts a process's wall clock under ``path``'s control."""

    def __init__(self, path: Path) -> None:
        found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
        if not found:
            missing("libfaketime is not installed (apt-get install -y faketime)")
        self.path = path
        self.set(0)
        self.env = {
            "LD_PRELOAD": found[0],
            "FAKETIME_TIMESTAMP_FILE": str(path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def set(self, offset_s: int) -> None:
        """Move the wall clock to ``offset_s`` seconds from the real time, at once."""
        self.path.write_text(f"{offset_s:+d}\n")


@pytest.fixture
def clock(tmp_path: Path) -> FakeClock:
    return FakeClock(tmp_path / "clock")


@pytest.fixture
def server(tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``hearth serve faultapp:app`` under the fake clock; ``timed``'s settings come from the
    test's ``timing`` marker: (tool seconds, timeout seconds)."""
    wait_s, timeout_s = request.node.get_closest_marker("timing").args
    made = serve(
        tmp_path / "h.db",
        tmp_path / "server.log",
        HEARTH_TEST_ACKS=str(tmp_path / "acks.log"),
        HEARTH_TEST_WAIT_S=str(wait_s),
        HEARTH_TEST_TIMEOUT_S=str(timeout_s),
        **FAST_LEASES,
        **clock.env,
    )
    made.start(timeout=60)
    try:
        yield made
    finally:
        made.kill()


def post(server: ServerProcess, agent: str, conv: str, message: str) -> str:
    url = f"{server.url}/agents/{agent}/{conv}"
    answer = httpx2.post(url, json={"message": message}, timeout=15)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["submission_id"])


def view(server: ServerProcess, agent: str, conv: str, sid: str, wait: float) -> Any:
    answer = httpx2.get(
        f"{server.url}/agents/{agent}/{conv}/submissions/{sid}",
        params={"wait": wait},
        timeout=wait + 10,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def wall(record: Record) -> float:
    return datetime.fromisoformat(record.at.replace("Z", "+00:00")).timestamp()


def stop_and_read(server: ServerProcess, conv: str) -> list[Record]:
    server.terminate()
    assert server.wait(30) == 0

    async def read(store: Any) -> list[Record]:
        await assert_invariants(store)
        return list(await store.read(conv))

    return list(on_store(server.db_url, read))


@pytest.mark.timing(4, 30)
def test_a_forward_jump_neither_times_out_a_live_submission_nor_expires_its_lease(
    server: ServerProcess, clock: FakeClock, tmp_path: Path
) -> None:
    sid = post(server, "timed", "t1", "wait a little")
    wait_until(lambda: any(a[0] == "wait-start" for a in acks(tmp_path / "acks.log")), 15)
    clock.set(JUMP)  # mid-tool: the wall clock leaps five hours ahead
    done = view(server, "timed", "t1", sid, wait=60)
    assert (done["status"], done["outcome"]) == ("settled", "completed"), done
    assert [a[0] for a in acks(tmp_path / "acks.log")] == ["wait-start", "wait-done"]
    records = stop_and_read(server, "timed/t1")
    assert {r.attempt for r in records} - {None} == {1}  # never re-claimed: the lease held
    [outcome] = [r for r in records if isinstance(r, ToolOutcome)]
    [settled] = [r for r in records if isinstance(r, SubmissionSettled)]
    assert outcome.content == "waited"
    # The jump did happen inside the server: its records' wall-clock stamps leapt.
    assert wall(settled) - wall(records[0]) > JUMP - 600


@pytest.mark.timing(120, 6)
def test_a_backward_jump_does_not_extend_a_submission_past_its_timeout(
    server: ServerProcess, clock: FakeClock, tmp_path: Path
) -> None:
    sid = post(server, "timed", "t2", "wait a long time")
    wait_until(lambda: any(a[0] == "wait-start" for a in acks(tmp_path / "acks.log")), 15)
    started = time.monotonic()
    clock.set(-JUMP)  # mid-tool: the wall clock falls five hours back
    done = view(server, "timed", "t2", sid, wait=60)
    assert done["status"] == "settled", f"still {done['status']} a minute after its timeout"
    assert time.monotonic() - started < 60
    assert done["outcome"] == "failed" and done["error"]["type"] == "timeout", done
    assert [a[0] for a in acks(tmp_path / "acks.log")] == ["wait-start"]
    records = stop_and_read(server, "timed/t2")
    [settled] = [r for r in records if isinstance(r, SubmissionSettled)]
    assert wall(settled) - wall(records[0]) < -(JUMP - 600)  # the jump did happen inside
