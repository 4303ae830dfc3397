"""Where the time of one SQLite ``step.do`` goes, layer by layer, next to the raw commit floor.

Each layer adds one part of hearth on top of the one before it; every sample is one durable
commit on a fresh file opened as hearth opens its own (WAL, ``synchronous=FULL``, exclusive
locking):

- ``floor``: plain ``sqlite3`` committing one 150-byte row (as ``bench/peers.py``'s floor).
- ``sql``: the statements a step's fenced append runs (fence and end, insert, update) with their
  parameters made beforehand, on hearth's schema: what the disk and SQLite cost for hearth's rows.
- ``json``: the same statements, each step's record made as a plain dict and encoded once with
  ``json.dumps`` inside the timing: the least Python any program must run to store these rows
  (SPEC's fence, dense offset and JSON record), with no digest, no record class, no event loop.
- ``ops.append``: ``sqlite_ops.append`` called directly on the connection, inside
  ``BEGIN IMMEDIATE``/``COMMIT``: adds hearth's record classes and the digest (encoding the
  record twice: its stored body and its canonical content), all in Python.
- ``store.append``: awaited through ``SQLiteStore`` on an event loop: adds the writer's hand-off
  and the future.
- ``step.do``: a durable tool's step (``bench/step_overhead.py``): adds the runtime (the step
  record, the attempt's journal, metrics).

    .venv/bin/python bench/step_anatomy.py [--steps 2000] [--rounds 3]

Printed: each layer's median and p99 (over rounds, the median of each round's figure), its ratio
to the floor, and what it adds to the layer before it; then the median of the ``COMMIT``
statement alone inside the ``step.do`` layer (SQLite writing and syncing a step's pages, no
Python) against the floor's whole transaction; and the ``ops.append`` layer's work before its
``COMMIT``, timed alone at ``synchronous=FULL`` and at ``OFF``: the same CPU work costs more
right after a synced commit. The first ``--warmup`` commits of every run are dropped (a commit
that grows the WAL costs about twice one that reuses it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _peer_cases import floor_commit
from step_overhead import measure_step_do

from hearth.records import ToolStepSettled
from hearth.store import sqlite_ops
from hearth.store.rows import Fence, NewSubmission
from hearth.store.sqlite import SQLiteStore
from hearth.store.sqlite_schema import connect
from hearth.store.sqlite_writer import GroupCommitWriter

LAYERS = ("floor", "sql", "json", "ops.append", "store.append", "step.do")
CONVERSATION = "anatomy/c-1"


def step_record(i: int, fence: Fence) -> ToolStepSettled:
    record = ToolStepSettled(
        id=f"m_1:step:call_1:s{i}", tool_call_id="call_1", step=f"s{i}", value=1
    )
    return record.stamped(fence.submission_id, fence.attempt)


async def prepared(path: Path) -> tuple[SQLiteStore, Fence]:
    """An open store on ``path`` with one running submission: the fence a step appends under."""
    store = SQLiteStore(str(path), synchronous="FULL")
    await store.open()
    await store.admit(NewSubmission(CONVERSATION, "anatomy", "message", {"text": "go"}))
    (claimed,) = await store.claim("bench", 3600, 1)
    return store, claimed.fence


def timed(n: int, one: Callable[[int], None]) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        one(i)
        samples.append(time.perf_counter() - t0)
    return samples


def run_floor(where: Path, n: int) -> list[float]:
    commit = floor_commit("sqlite", str(where))()
    return timed(n, lambda _: commit())


def run_on_connection(where: Path, n: int, *, work: bool, encode: bool = False) -> list[float]:
    path = where / "hearth.db"
    fence = asyncio.run(_prepare_and_close(path))
    conn = connect(str(path), "FULL")
    outbox: list[object] = []
    try:
        if work:

            def one(i: int) -> None:
                conn.execute("BEGIN IMMEDIATE")
                sqlite_ops.append(
                    conn, CONVERSATION, [step_record(i, fence)], outbox, time.time(), fence
                )
                conn.execute("COMMIT")
                outbox.clear()

            return timed(n, one)
        # The same statements, their parameters made beforehand (outside the timing).
        last = conn.execute(
            "SELECT last_offset FROM conversations WHERE conversation_id = ?", (CONVERSATION,)
        ).fetchone()[0]
        if encode:
            return timed(n, least(conn, fence, last))
        rows = []
        for i in range(n):
            body, digest = step_record(i, fence).encode(last + 1 + i)
            rows.append((last + 1 + i, step_record(i, fence), body, digest))

        def statements(i: int) -> None:
            offset, record, body, digest = rows[i]
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sqlite_ops._FENCE_AND_END, (CONVERSATION, fence.submission_id))
            conn.execute(
                'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body,'
                " digest) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (CONVERSATION, offset, record.id, record.type, record.submission_id, body, digest),
            )
            conn.execute(
                "UPDATE conversations SET last_offset = ?, last_activity = ?"
                " WHERE conversation_id = ?",
                (offset, time.time(), CONVERSATION),
            )
            conn.execute("COMMIT")

        return timed(n, statements)
    finally:
        conn.close()


def least(conn: sqlite3.Connection, fence: Fence, last: int) -> Callable[[int], None]:
    """One step's record as a plain dict, encoded once, and the fenced statements that store it."""
    submission_id = fence.submission_id

    def one(i: int) -> None:
        offset, record_id = last + 1 + i, f"m_1:step:call_1:s{i}"
        record = {
            "offset": offset,
            "id": record_id,
            "type": "tool_step_settled",
            "submission_id": submission_id,
            "attempt": fence.attempt,
            "at": "2026-12-07T00:00:00.000Z",
            "tool_call_id": "call_1",
            "step": f"s{i}",
            "value": 1,
        }
        body = json.dumps(record, separators=(",", ":"))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sqlite_ops._FENCE_AND_END, (CONVERSATION, submission_id)).fetchone()
        conn.execute(
            'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body,'
            " digest) VALUES (?, ?, ?, ?, ?, ?, '') ON CONFLICT DO NOTHING",
            (CONVERSATION, offset, record_id, "tool_step_settled", submission_id, body),
        )
        conn.execute(
            "UPDATE conversations SET last_offset = ?, last_activity = ? WHERE conversation_id = ?",
            (offset, time.time(), CONVERSATION),
        )
        conn.execute("COMMIT")

    return one


async def _prepare_and_close(path: Path) -> Fence:
    store, fence = await prepared(path)
    await store.close()
    return fence


def run_store_append(where: Path, n: int) -> list[float]:
    async def go() -> list[float]:
        store, fence = await prepared(where / "hearth.db")
        try:
            samples = []
            for i in range(n):
                record = step_record(i, fence)
                t0 = time.perf_counter()
                await store.append(CONVERSATION, [record], fence=fence)
                samples.append(time.perf_counter() - t0)
            return samples
        finally:
            await store.close()

    return asyncio.run(go())


# The COMMIT statements of the step.do layer's runs, each timed alone: the part of a step that
# is SQLite syncing hearth's pages, which no Python can make shorter.
commits: list[float] = []


def run_step_do(where: Path, n: int) -> list[float]:
    commit = GroupCommitWriter._commit

    def timed_commit(self: GroupCommitWriter, conn: sqlite3.Connection) -> None:
        t0 = time.perf_counter()
        commit(self, conn)
        commits.append(time.perf_counter() - t0)

    commits.clear()
    GroupCommitWriter._commit = timed_commit  # type: ignore[method-assign]
    try:
        return asyncio.run(measure_step_do(n, f"sqlite:///{where / 'bench.db'}?synchronous=FULL"))
    finally:
        GroupCommitWriter._commit = commit  # type: ignore[method-assign]


def work_before_commit(where: Path, n: int, synchronous: str) -> list[float]:
    """The ``ops.append`` layer's work before its ``COMMIT`` (encoding, the fence check, the
    statements), timed alone, on a file opened with ``synchronous``."""
    path = where / "hearth.db"
    fence = asyncio.run(_prepare_and_close(path))
    conn = connect(str(path), synchronous)
    outbox: list[object] = []
    samples = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            sqlite_ops.append(
                conn, CONVERSATION, [step_record(i, fence)], outbox, time.time(), fence
            )
            samples.append(time.perf_counter() - t0)
            conn.execute("COMMIT")
            outbox.clear()
        return samples
    finally:
        conn.close()


def measure(layer: str, where: Path, n: int) -> list[float]:
    if layer == "floor":
        return run_floor(where, n)
    if layer == "sql":
        return run_on_connection(where, n, work=False)
    if layer == "json":
        return run_on_connection(where, n, work=False, encode=True)
    if layer == "ops.append":
        return run_on_connection(where, n, work=True)
    if layer == "store.append":
        return run_store_append(where, n)
    return run_step_do(where, n)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="samples kept per run")
    parser.add_argument("--warmup", type=int, default=1000, help="commits run and dropped first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds of quiet before a run")
    args = parser.parse_args()
    medians: dict[str, list[float]] = {layer: [] for layer in LAYERS}
    tails: dict[str, list[float]] = {layer: [] for layer in LAYERS}
    commit_medians: list[float] = []
    for r in range(args.rounds):
        for layer in LAYERS:
            with tempfile.TemporaryDirectory() as tmp:
                os.sync()  # none pays for the write-back of the one before
                time.sleep(args.pause)
                kept = measure(layer, Path(tmp), args.warmup + args.steps)[args.warmup :]
            medians[layer].append(statistics.median(kept) * 1000)
            if layer == "step.do":
                commit_medians.append(statistics.median(commits[args.warmup :] or commits) * 1000)
            tails[layer].append(p99(kept) * 1000)
            print(f"  round {r + 1} {layer}: median {medians[layer][-1]:.3f} ms", flush=True)
    print(
        f"\none step on SQLite, synchronous=FULL ({args.rounds} rounds, {args.steps} samples each)"
    )
    print(f"  {'layer':<13} {'median':>9} {'p99':>9} {'÷ floor':>8} {'adds':>9}")
    floor = statistics.median(medians["floor"])
    before = None
    for layer in LAYERS:
        median, tail = statistics.median(medians[layer]), statistics.median(tails[layer])
        adds = "" if before is None else f"{(median - before) * 1000:+.0f} µs"
        print(f"  {layer:<13} {median:>6.3f} ms {tail:>6.3f} ms {median / floor:>7.2f}x {adds:>9}")
        before = median
    by_round = " ".join(
        f"{j / f:.2f}x" for j, f in zip(medians["json"], medians["floor"], strict=True)
    )
    print(
        f"  json ÷ floor, round by round: {by_round} (SPEC §13 allows 1.25x for the whole step,"
        " runtime included)"
    )
    commit = statistics.median(commit_medians)
    print(
        f"  step.do's COMMIT statement alone: median {commit:.3f} ms, {commit / floor:.2f}x the"
        " floor's whole transaction"
    )
    # The same work costs more right after a synced commit than with nothing synced: the CPU
    # idled through the sync, and what runs next finds its caches cold.
    before: dict[str, list[float]] = {"FULL": [], "OFF": []}
    for _ in range(args.rounds):
        for mode in before:
            with tempfile.TemporaryDirectory() as tmp:
                os.sync()
                time.sleep(args.pause)
                kept = work_before_commit(Path(tmp), args.warmup + args.steps, mode)[args.warmup :]
            before[mode].append(statistics.median(kept) * 1e6)
    full, off = statistics.median(before["FULL"]), statistics.median(before["OFF"])
    print(
        f"  ops.append's work before its COMMIT: {full:.0f} µs after a synced commit"
        f" (synchronous=FULL), {off:.0f} µs with nothing synced (OFF): {full / off:.2f}x"
    )


if __name__ == "__main__":
    main()
