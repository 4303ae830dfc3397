"""Submissions settled per second by 1 and by 2 hearth processes sharing one PostgreSQL database.

The workload of ``bench/end_to_end.py``: a scripted instant model, one tool call per submission,
N submissions over C conversations. For each process count P, a fresh schema is made and P child
processes (this file with ``--child``) each run ``App([worker], db=URL).run()`` on it with the
default settings (64 workers each, pool of 10 connections). Once every child is ready, the bench
process admits the N submissions through its own ``PostgresStore`` (``admit``, as
``Runtime.dispatch`` does, 64 at a time) and waits until none is queued or running (it looks every
20 ms). Printed: the time from the first admission to the last settlement, settled/s, and how many
settlements each process made (its own count, printed when it stops).

Everything shares the machine: the server, the children and the admitting process.

    .venv/bin/python bench/pg_end_to_end.py --quick                 # 200 submissions, 1 and 2
    .venv/bin/python bench/pg_end_to_end.py --submissions 2000 --conversations 200
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import _pg
from end_to_end import script, worker  # the same workload

import hearth
from hearth.store import NewSubmission, open_store
from hearth.testing import ScriptedModel

# --- the child: one hearth process ---------------------------------------------------------------


async def child(url: str) -> None:
    app = hearth.App([worker], db=url, providers=[ScriptedModel("bench", script)])
    await _pg.serve_until_terminated(app)
    print(f"settled {sum(app.metrics.settled_by_outcome.values())}", flush=True)


def start_children(url: str, count: int) -> list[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
    procs = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", url],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(count)
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            raise SystemExit(f"a child did not start: {line!r}")
    return procs


def stop_children(procs: list[subprocess.Popen[str]]) -> list[int]:
    """Stop the children; return how many submissions each settled."""
    for proc in procs:
        proc.terminate()
    counts = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        found = [line.split()[1] for line in out.splitlines() if line.startswith("settled ")]
        counts.append(int(found[0]) if found else -1)
    return counts


# --- the bench -----------------------------------------------------------------------------------


async def run_once(url: str, submissions: int, conversations: int) -> tuple[float, int]:
    store = open_store(url)
    await store.open()
    try:
        news = [
            NewSubmission(f"worker/c{i % conversations}", "worker", "message", {"message": f"m{i}"})
            for i in range(submissions)
        ]
        sem = asyncio.Semaphore(64)

        async def admit(new: NewSubmission) -> None:
            async with sem:
                await store.admit(new)

        start = time.perf_counter()
        await asyncio.gather(*(admit(n) for n in news))
        for _ in range(30_000):  # at most ten minutes
            if not await store.list_submissions(statuses=["queued", "running"], limit=1):
                break
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - start
        failed = await store.list_submissions(statuses=["settled"], limit=submissions)
        return elapsed, sum(1 for sub in failed if sub.outcome != "completed")
    finally:
        await store.close()


def main(args: argparse.Namespace) -> None:
    results: list[tuple[int, float, list[int]]] = []
    with _pg.server(args.pg) as server:
        print(f"PostgreSQL: {server.settings()}")
        for count in args.processes:
            for _ in range(args.repeat):
                url = server.url()
                procs = start_children(url, count)
                try:
                    elapsed, failed = asyncio.run(
                        run_once(url, args.submissions, args.conversations)
                    )
                finally:
                    split = stop_children(procs)
                rate = args.submissions / elapsed
                print(
                    f"  {count} process(es): {args.submissions} settled in {elapsed:.2f} s,"
                    f" {rate:.0f}/s, per process {split}"
                    + (f", {failed} not completed" if failed else ""),
                    flush=True,
                )
                results.append((count, elapsed, split))
    print()
    print(f"{args.submissions} submissions over {args.conversations} conversations")
    print(f"{'processes':>9} {'seconds':>8} {'settled/s':>9}  settled per process")
    for count, elapsed, split in results:
        print(f"{count:>9} {elapsed:>8.2f} {args.submissions / elapsed:>9.0f}  {split}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=2000)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=1, help="runs per process count")
    parser.add_argument("--quick", action="store_true", help="200 submissions over 50")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    _pg.add_argument(parser)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child))
        sys.exit(0)
    if args.quick:
        args.submissions, args.conversations = 200, 50
    main(args)
