"""Claim latency with few and with many queued submissions, on both stores (SPEC §13: a claim is
O(1) in queued rows).

For each store (a SQLite file with ``synchronous=FULL``; PostgreSQL with its default settings) and
each size N, the store is filled with N queued submissions, each in its own conversation, then
``store.claim(owner, 30, 1)`` is timed ``--claims`` times (after ``--warmup`` untimed ones).
Between two claims, untimed, the claimed submission is settled and one new submission is admitted
in a new conversation, so the queue stays at N and every claim takes the oldest one, as a
coordinator does. Printed: median, p90 and p99 per store and size, and the ratio of the largest
size to the smallest.

The fill writes the rows ``admit`` would write (a conversation, its ``conversation_created``
record, a ``queued`` submission), encoded by hearth's own ``rules`` and records, in bulk: one
``executemany`` transaction on SQLite (with the store closed, as it owns its file), ``COPY`` on
PostgreSQL, followed there by ``ANALYZE`` (autovacuum would do the same within a minute of such
an insert). ``--fill admit`` goes through ``store.admit`` instead (200 at a time; slow at 100k).

    .venv/bin/python bench/claim_latency.py --quick               # 100 vs 10,000, 50 claims
    .venv/bin/python bench/claim_latency.py                       # 100 vs 100,000, 200 claims
    .venv/bin/python bench/claim_latency.py --stores postgres --pg postgresql://u@host:5432/db

``--behind-running K`` measures the other shape of a queue: the N queued submissions wait in K
conversations whose first submission is running (claimed by another owner with a live lease), so
nothing is runnable and each timed claim returns nothing (as every coordinator's claim does
when it is woken by an admission into a busy conversation).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _pg

from hearth.store import NewSubmission, Store, open_store, rules

OWNER = "bench-host:boot:1:1"
CONVERSATIONS = "conversation_id, agent, parent, last_offset, created_at"
RECORDS = 'conversation_id, "offset", id, type, submission_id, body, digest'
SUBMISSIONS = (
    "id, conversation_id, kind, payload, idempotency_key, payload_digest, admitted_offset,"
    " status, attempt, max_attempts, timeout, accepted_at, is_head"
)


def new(i: int, prefix: str = "q") -> NewSubmission:
    return NewSubmission(f"bench/{prefix}{i}", "bench", "message", {"message": f"m{i}"})


def rows(
    size: int, heads: int = 0
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]]:
    """The rows ``admit`` writes for ``size`` submissions: each the first of a new conversation,
    or (``heads`` > 0) each a later one in conversation ``i mod heads``, which exist already."""
    now = time.time()
    for i in range(size):
        sub = new(i % heads if heads else i, prefix="h" if heads else "q")
        created = rules.conversation_created(sub)
        body, digest = created.encode(0)
        yield (
            (sub.conversation_id, sub.agent, None, 0, now),
            (sub.conversation_id, 0, created.id, created.type, None, body, digest),
            (
                rules.new_submission_id(),
                sub.conversation_id,
                sub.kind,
                rules.to_json(sub.payload),
                None,
                rules.payload_digest(sub.kind, sub.payload),
                0,
                "queued",
                0,
                sub.max_attempts,
                sub.timeout,
                now + i * 1e-6,
                not heads,  # the first of its conversation is its head; later ones wait
            ),
        )


def fill_sqlite(path: Path, size: int, heads: int) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            table = list(rows(size, heads))
            if not heads:
                conn.executemany(
                    f"INSERT INTO conversations ({CONVERSATIONS}) VALUES (?, ?, ?, ?, ?)",
                    [r[0] for r in table],
                )
                conn.executemany(
                    f"INSERT INTO records ({RECORDS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [r[1] for r in table],
                )
            conn.executemany(
                f"INSERT INTO submissions ({SUBMISSIONS}) VALUES ({', '.join('?' * 13)})",
                [r[2] for r in table],
            )
    finally:
        conn.close()


def fill_postgres(server: _pg.Server, schema: str, size: int, heads: int, analyze: bool) -> None:
    with server.connect(options=f"-c search_path={schema}") as conn, conn.transaction():
        table = list(rows(size, heads))
        for index, (name, columns) in enumerate(
            [("conversations", CONVERSATIONS), ("records", RECORDS), ("submissions", SUBMISSIONS)]
        ):
            if heads and index < 2:
                continue
            with conn.cursor().copy(f"COPY {name} ({columns}) FROM STDIN") as copy:
                for r in table:
                    copy.write_row(r[index])
    if analyze:
        with server.connect(options=f"-c search_path={schema}") as conn:
            conn.execute("ANALYZE")


async def fill_admit(store: Store, size: int, heads: int) -> None:
    for start in range(0, size, 200):
        await asyncio.gather(
            *(
                store.admit(new(i % heads, "h") if heads else new(i))
                for i in range(start, min(size, start + 200))
            )
        )


async def running_heads(store: Store, heads: int) -> None:
    """``heads`` conversations whose first submission runs under another owner's live lease."""
    for i in range(heads):
        await store.admit(new(i, prefix="h"))
    claimed = await store.claim("other-host:boot:1:1", 3600.0, heads)
    assert len(claimed) == heads


async def open_filled(
    kind: str, size: int, args: argparse.Namespace, tmp: Path, server: _pg.Server | None
) -> Store:
    fill, heads = args.fill, args.behind_running
    if kind == "sqlite":
        path = tmp / f"claims-{size}.db"
        store: Store = open_store(f"sqlite:///{path}")
        if fill == "sql":
            await store.open()  # creates the schema
            await running_heads(store, heads)
            await store.close()
            fill_sqlite(path, size, heads)
            store = open_store(f"sqlite:///{path}")
        await store.open()
    else:
        assert server is not None
        url = server.url()
        store = open_store(url)
        await store.open()
        if fill == "sql":
            await running_heads(store, heads)
            schema = server.schemas[-1]
            await asyncio.to_thread(fill_postgres, server, schema, size, heads, args.analyze)
    if fill == "admit":
        await running_heads(store, heads)
        await fill_admit(store, size, heads)
    queued = await store.list_submissions(statuses=["queued"], limit=size + 1)
    assert len(queued) == size, (len(queued), size)
    return store


async def measure_blocked(store: Store, claims: int, warmup: int) -> list[float]:
    """Claims that find nothing: every queued submission waits behind a running one."""
    samples: list[float] = []
    for i in range(warmup + claims):
        t0 = time.perf_counter()
        got = await store.claim(OWNER, 30.0, 1)
        elapsed = time.perf_counter() - t0
        assert got == [], got
        if i >= warmup:
            samples.append(elapsed)
    return samples


async def measure(store: Store, claims: int, warmup: int) -> list[float]:
    samples: list[float] = []
    last_seq = 0
    for i in range(warmup + claims):
        t0 = time.perf_counter()
        got = await store.claim(OWNER, 30.0, 1)
        elapsed = time.perf_counter() - t0
        assert len(got) == 1 and got[0].seq > last_seq, got
        sub = got[0]
        last_seq = sub.seq
        if i >= warmup:
            samples.append(elapsed)
        record = rules.settlement(sub.id, "completed", None, "ok")
        await store.settle(sub.fence, record, outcome="completed", error=None, reply="ok")
        await store.admit(new(i, prefix="t"))
    return samples


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> None:
    results: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="hearth-claims-") as d, pg_server(args) as server:
        if server is not None:
            print(f"PostgreSQL: {server.settings()}")
        for kind in args.stores:
            for size in args.sizes:
                t0 = time.perf_counter()
                store = await open_filled(kind, size, args, Path(d), server)
                filled = time.perf_counter() - t0
                try:
                    how = measure_blocked if args.behind_running else measure
                    results[kind, size] = await how(store, args.claims, args.warmup)
                finally:
                    await store.close()
                med = statistics.median(results[kind, size]) * 1000
                print(
                    f"  {kind} {size:>7,} queued: filled ({args.fill}) in {filled:.1f} s,"
                    f" claim median {med:.3f} ms",
                    flush=True,
                )
    print()
    print(f"{'store':<9} {'queued':>8} {'claims':>6} {'median ms':>9} {'p90 ms':>8} {'p99 ms':>8}")
    for (kind, size), samples in results.items():
        ms = [s * 1000 for s in samples]
        print(
            f"{kind:<9} {size:>8,} {len(ms):>6} {statistics.median(ms):>9.3f}"
            f" {pct(ms, 0.9):>8.3f} {pct(ms, 0.99):>8.3f}"
        )
    small, large = min(args.sizes), max(args.sizes)
    for kind in args.stores:
        if small != large:
            a = statistics.median(results[kind, small])
            b = statistics.median(results[kind, large])
            print(f"{kind}: median at {large:,} / median at {small:,} = {b / a:.2f}x")


def pg_server(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    if "postgres" not in args.stores:
        return contextlib.nullcontext(None)
    return _pg.server(args.pg)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--sizes", nargs="+", type=int, default=None, help="default 100 100000")
    parser.add_argument("--claims", type=int, default=None, help="timed claims (default 200)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--fill", choices=["sql", "admit"], default="sql")
    parser.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="PostgreSQL: do not ANALYZE after the bulk fill (the planner's estimates stay stale)",
    )
    parser.add_argument(
        "--behind-running",
        type=int,
        default=0,
        metavar="K",
        help="put the N queued submissions in K conversations whose first submission is running"
        " (another owner's live lease), and time claims that find nothing runnable",
    )
    parser.add_argument("--quick", action="store_true", help="100 vs 10,000 queued, 50 claims")
    _pg.add_argument(parser)
    args = parser.parse_args()
    args.sizes = args.sizes or ([100, 10_000] if args.quick else [100, 100_000])
    args.claims = args.claims or (50 if args.quick else 200)
    for store_kind in args.stores:
        if store_kind not in ("sqlite", "postgres"):
            parser.error(f"unknown store {store_kind!r}: sqlite or postgres")
    asyncio.run(main(args))
