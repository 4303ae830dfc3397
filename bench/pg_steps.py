"""``step.do`` on PostgreSQL next to one raw ``INSERT`` + ``COMMIT`` round trip to the same server
(SPEC §13: median ≤ 1.5× the raw round trip, with ``synchronous_commit=on``).

Both rows run in one process against one server, one after the other, then again (raw, step.do,
raw, step.do), so that drift shows:

* raw: an async psycopg connection (as the store uses) runs ``INSERT INTO raw_steps (id, body)
  VALUES (...)`` of a ~150-byte row and ``COMMIT``; one sample is the pair.
* step.do: one durable tool call runs N trivial steps (``bench/step_overhead.py``'s
  measurement); one sample is one ``await ctx.step.do(name, fn)``.

The first 50 samples of each series are dropped as warm-up. Printed: median, p90, p99 per row
and the ratio of the step.do median to the raw median.

    .venv/bin/python bench/pg_steps.py --quick          # 300 samples per series
    .venv/bin/python bench/pg_steps.py --steps 2000
    .venv/bin/python bench/pg_steps.py --pg postgresql://u@host:5432/db
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import _pg
from step_overhead import measure_step_do

WARMUP = 50


async def measure_raw(conninfo: str, schema: str, n: int) -> list[float]:
    import psycopg

    samples: list[float] = []
    async with await psycopg.AsyncConnection.connect(
        conninfo, options=f"-c search_path={schema}"
    ) as conn:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_steps (id text PRIMARY KEY, body text NOT NULL)"
        )
        await conn.commit()
        body = "x" * 150
        for _ in range(n):
            t0 = time.perf_counter()
            await conn.execute(
                "INSERT INTO raw_steps (id, body) VALUES (%s, %s)", (uuid.uuid4().hex, body)
            )
            await conn.commit()
            samples.append(time.perf_counter() - t0)
    return samples


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(samples: list[float]) -> tuple[float, float, float, int]:
    ms = [s * 1000 for s in (samples[WARMUP:] if len(samples) > 2 * WARMUP else samples)]
    return statistics.median(ms), pct(ms, 0.9), pct(ms, 0.99), len(ms)


async def main(steps: int, rounds: int, pg: str | None) -> None:
    with _pg.server(pg) as server:
        print(f"PostgreSQL: {server.settings()}")
        rows: list[tuple[str, list[float]]] = []
        for r in range(rounds):
            url = server.url()
            raw = await measure_raw(server.conninfo, server.schemas[-1], steps)
            rows.append((f"raw INSERT+COMMIT #{r + 1}", raw))
            rows.append((f"step.do #{r + 1}", await measure_step_do(steps, url)))
    print()
    print(f"{'row':<22} {'n':>5} {'median ms':>9} {'p90 ms':>8} {'p99 ms':>8}")
    for name, samples in rows:
        median, p90, p99, n = summary(samples)
        print(f"{name:<22} {n:>5} {median:>9.3f} {p90:>8.3f} {p99:>8.3f}")
    for r in range(rounds):
        raw_median = summary(rows[2 * r][1])[0]
        step_median = summary(rows[2 * r + 1][1])[0]
        print(f"round {r + 1}: step.do median / raw median = {step_median / raw_median:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="samples per series")
    parser.add_argument("--rounds", type=int, default=2, help="raw + step.do pairs")
    parser.add_argument("--quick", action="store_true", help="300 samples, one round")
    _pg.add_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 300, 1
    asyncio.run(main(args.steps, args.rounds, args.pg))
