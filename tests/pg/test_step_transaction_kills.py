"""``step.transaction`` under real SIGKILLs on a real PostgreSQL: processes are killed before,
during and after the commit of transactions that insert into the application's own table (which
has no unique key, so a duplicate would show). Afterwards each booked row is there exactly once,
and the step records agree with the rows, one for one.

The default run makes ``HEARTH_TX_KILLS`` kills (25, well under half a minute on an idle machine);
the full torture, ≥ 100 kills, is::

    HEARTH_TX_KILLS=120 .venv/bin/pytest -q -s tests/pg/test_step_transaction_kills.py
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from pathlib import Path

import pytest
from pgcluster import Cluster

from hearth.records import SubmissionSettled, ToolOutcome, ToolStepSettled
from hearth.testing import CrashHarness
from hearth.testing.toollog import tool_runs

pytestmark = pytest.mark.crash

APPS = Path(__file__).resolve().parents[1] / "apps"
KILLS = int(os.environ.get("HEARTH_TX_KILLS", "25"))
# Before the transaction; inside it (the application's rows written, then the step record too,
# not committed); after its COMMIT (nobody heard of it, then the journal did); between two.
POINTS = [
    "step:first",
    "step-done:first",
    "step-done:first>store:commit-begin",
    "step-done:first>store:commit-done",
    "after:store.transact",
    "step:mid",
    "step:second",
    "step-done:second",
    "step-done:second>store:commit-begin",
    "step-done:second>store:commit-done",
]


@pytest.mark.timeout(120 + 10 * KILLS)  # a bound on a hang, not a timing claim
def test_each_booked_row_is_there_exactly_once_across_kills(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    table = f"bookings_{uuid.uuid4().hex[:10]}"
    pg_cluster.sql(f"CREATE TABLE public.{table} (tool_call_id text, step text, n int)")
    log = tmp_path / "ran.log"
    harness = CrashHarness(
        "txapp:app",
        db=pg_cluster.url(),
        env={
            "TX_TABLE": table,
            "HEARTH_TEST_LOG": str(log),
            "HEARTH_LEASE_S": "5",
            "HEARTH_HEARTBEAT_S": "1",
            "HEARTH_SCAN_S": "1",
        },
        pythonpath=[APPS],
    )
    i = 0
    while harness.kills < KILLS:
        assert i < KILLS * 3, f"only {harness.kills} kills in {i} runs"
        point = POINTS[i % len(POINTS)] + ("#2" if (i // len(POINTS)) % 2 else "")
        harness.run(dispatch=[("booker", f"c{i}", "book")], crash_at=point)
        i += 1
        if i % 4 == 0:  # let the work killed so far finish, so that kills land on fresh work too
            harness.run_until_settled()
    assert harness.run_until_settled() >= 1
    # A run killed by recovered work before its own dispatch was admitted admits nothing.
    conversations = sorted({s.conversation_id for s in harness.submissions()})
    assert len(conversations) >= KILLS // 2

    rows = Counter(
        tuple(line.split("|"))
        for line in pg_cluster.sql(f"SELECT tool_call_id, step, n FROM public.{table}").splitlines()
    )
    steps: dict[tuple[str, str], object] = {}
    booked: list[str] = []  # the calls whose outcome the model saw as booked
    for conversation in conversations:
        records = harness.history(conversation)
        ends = [(r.outcome, r.error) for r in records if isinstance(r, SubmissionSettled)]
        assert ends == [("completed", None)], (conversation, ends)
        for r in records:
            if isinstance(r, ToolStepSettled) and r.step in ("first", "second"):
                key = (f"{conversation}:{r.tool_call_id}", r.step)
                assert key not in steps
                steps[key] = r.value
            if isinstance(r, ToolOutcome):
                assert not r.is_error, r.content
                assert (r.content["first"], r.content["second"]) == (1, 2)
                booked.append(f"{conversation}:{r.tool_call_id}")
    assert len(booked) >= 2 * len(conversations)
    assert {(c, s) for c in booked for s in ("first", "second")} == set(steps)
    assert all(n == 1 for n in rows.values()), [k for k, n in rows.items() if n > 1]
    assert {(call_id, step) for call_id, step, _ in rows} == set(steps)
    assert all(steps[(c, s)] == (1 if s == "first" else 2) for c, s in steps)
    harness.assert_invariants(tool_runs(log))
    print(f"step.transaction torture: {harness.kills} kills in {harness.runs} runs")
