"""Abort delivery across processes on PostgreSQL: from the abort call in one process to the
``aborted`` settlement being visible there, while another process runs the work (SPEC §13: p99
≤ 100 ms).

A child process (this file with ``--child``) runs ``App([staller], db=URL).run()``: the agent's
scripted model stalls forever. For each trial the bench process, through its own
``PostgresStore``, admits one message in a new conversation, waits until the child has claimed
it and then ``--settle-ms`` more (so the attempt is inside the stalled model call), and then calls
``request_abort`` (what ``Runtime.abort`` does). The clock runs from that call until the bench
process reads the submission with outcome ``aborted``; it waits on its own store's settlement
events (``LISTEN``), and reads again every 50 ms in case one is lost. The path measured: abort
commit + ``NOTIFY`` → the child's listener → its coordinator cancels the attempt → the attempt
settles ``aborted`` + ``NOTIFY`` → the bench's listener → one read.

    .venv/bin/python bench/pg_abort.py --quick           # 10 trials
    .venv/bin/python bench/pg_abort.py --trials 100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _pg

import hearth
from hearth.store import NewSubmission, Store, open_store
from hearth.testing import ScriptedModel, stall


@hearth.agent
def staller(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/stall")
    return ""


async def child(url: str) -> None:
    model = ScriptedModel("stall", [stall()], repeat_last=True)
    await _pg.serve_until_terminated(hearth.App([staller], db=url, providers=[model]))


async def settled_outcome(store: Store, submission_id: str, limit_s: float = 10.0) -> str | None:
    """Wait for the submission's outcome as the runtime does: its settlement event, or a read."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        woken = store.events.watch_settled(submission_id)
        try:
            sub = await store.get_submission(submission_id)
            assert sub is not None
            if sub.outcome is not None:
                return sub.outcome
            await asyncio.wait({woken}, timeout=0.05)
        finally:
            store.events.unwatch_settled(submission_id, woken)
    return None


async def trials(url: str, n: int, settle_ms: float) -> list[float]:
    store = open_store(url)
    await store.open()
    samples: list[float] = []
    try:
        for i in range(n):
            new = NewSubmission(f"staller/t{i}", "staller", "message", {"message": "hi"})
            sid = (await store.admit(new)).submission.id
            for _ in range(1000):
                sub = await store.get_submission(sid)
                if sub is not None and sub.status == "running":
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(settle_ms / 1000)
            t0 = time.perf_counter()
            ids = await store.request_abort(new.conversation_id)
            outcome = await settled_outcome(store, sid)
            elapsed = time.perf_counter() - t0
            assert ids == [sid] and outcome == "aborted", (ids, outcome)
            samples.append(elapsed)
    finally:
        await store.close()
    return samples


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(args: argparse.Namespace) -> None:
    with _pg.server(args.pg) as server:
        print(f"PostgreSQL: {server.settings()}")
        url = server.url()
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", url],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("ready"):
                raise SystemExit(f"the child did not start: {line!r}")
            samples = asyncio.run(trials(url, args.trials, args.settle_ms))
        finally:
            proc.terminate()
            proc.wait(30)
    ms = [s * 1000 for s in samples]
    print(f"abort → aborted visible, across processes: {len(ms)} trials")
    print(
        f"  p50 {statistics.median(ms):.1f} ms   p90 {pct(ms, 0.9):.1f} ms"
        f"   p99 {pct(ms, 0.99):.1f} ms   max {max(ms):.1f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--settle-ms", type=float, default=50.0, help="wait after the claim")
    parser.add_argument("--quick", action="store_true", help="10 trials")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    _pg.add_argument(parser)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child))
        sys.exit(0)
    if args.quick:
        args.trials = 10
    main(args)
