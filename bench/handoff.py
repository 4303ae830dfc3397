"""What a thread hand-off would cost a lone commit, next to what hearth's lone step costs.

hearth's SQLite store keeps one connection per process (the WAL-reset bug of SQLite < 3.51.3 rules
out more connections), and its callers are coroutines on the event loop. Operations asked for
together go to the writer thread as one group; a lone one, with the thread idle, runs on the loop
itself, because a hand-off to the thread and back costs two thread switches that the raw floor in
``bench/peers.py`` does not pay. This benchmark times, interleaved on one file:

* ``raw``: INSERT + COMMIT (WAL, ``synchronous=FULL``) called directly (the floor of peers.py);
* ``handoff``: the same INSERT + COMMIT queued from a coroutine to a writer thread, the coroutine
  woken with ``call_soon_threadsafe`` (what every lone step paid before it ran on the loop);
* ``hearth``: ``ctx.step.do`` of a durable tool (as in ``bench/step_overhead.py``).

    .venv/bin/python bench/handoff.py --samples 2000

Each run drops its first ``--warmup`` samples (1,000): the commits that grow a new file's WAL
cost about twice as much as the later ones, which reuse it.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from step_overhead import measure_step_do


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)")
    return conn


def commit_one(conn: sqlite3.Connection, k: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t (k, v) VALUES (?, ?)", (k, '{"value":1}'))
    conn.execute("COMMIT")


def raw(path: Path, n: int) -> list[float]:
    conn = connect(path)
    samples = []
    for k in range(n):
        t0 = time.perf_counter()
        commit_one(conn, k)
        samples.append(time.perf_counter() - t0)
    conn.close()
    return samples


Job = tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]] | None


def writer(path: Path, jobs: queue.SimpleQueue[Job]) -> None:
    conn = connect(path)
    while (job := jobs.get()) is not None:
        k, loop, done = job
        commit_one(conn, k)
        loop.call_soon_threadsafe(done.set_result, None)
    conn.close()


async def handoff(path: Path, n: int) -> list[float]:
    jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
    thread = threading.Thread(target=writer, args=(path, jobs))
    thread.start()
    loop = asyncio.get_running_loop()
    samples = []
    for k in range(n):
        t0 = time.perf_counter()
        done: asyncio.Future[None] = loop.create_future()
        jobs.put((k, loop, done))
        await done
        samples.append(time.perf_counter() - t0)
    jobs.put(None)
    await asyncio.to_thread(thread.join)
    return samples


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99)] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1000, help="samples dropped from each run")
    args = parser.parse_args()
    n = args.warmup + args.samples
    found: dict[str, list[float]] = {"raw": [], "handoff": [], "hearth": []}
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, Callable[[Path], list[float]]] = {
            "raw": lambda p: raw(p, n),
            "handoff": lambda p: asyncio.run(handoff(p, n)),
            "hearth": lambda p: asyncio.run(measure_step_do(n, f"sqlite:///{p}?synchronous=FULL")),
        }
        for r in range(args.rounds):
            for name, run in runs.items():
                found[name] += run(Path(tmp) / f"{name}-{r}.db")[args.warmup :]
    floor = summary(found["raw"])[0]
    for name, samples in found.items():
        median, p99 = summary(samples)
        print(
            f"{name:8} median {median:.3f} ms  p99 {p99:.3f} ms  ({median / floor:.2f}x the raw"
            " commit)"
        )


if __name__ == "__main__":
    main()
