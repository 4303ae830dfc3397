"""What one submission costs the hearth process on PostgreSQL: statements and Python CPU.

The peers bench's end-to-end workload (``_peer_cases.py``: a model turn, a tool call and a reply;
submissions dispatched all at once over 64 conversations) runs with every statement sent through
psycopg's cursors counted (each statement of a pipeline counts, though the pipeline is one round
trip). Printed: settled/s, the process's CPU per submission, statements per submission, and the
most frequent statements. A round trip costs the process on the order of
100 µs of CPU, so this is where the end-to-end rate on PostgreSQL goes.

    .venv/bin/python bench/pg_statements.py --submissions 1000 [--pg URL]
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import _peer_cases
import _pg
import psycopg


def counted_run(
    url: str, submissions: int
) -> tuple[dict[str, Any], float, collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()
    execute = psycopg.AsyncCursor.execute  # AsyncClientCursor's too: it inherits this one

    async def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else str(query)
        counts[" ".join(text.split())[:100]] += 1
        return await execute(self, query, *args, **kwargs)

    psycopg.AsyncCursor.execute = counting  # type: ignore[method-assign]
    try:
        t0 = time.process_time()
        result = _peer_cases.hearth("e2e", "pg", url, submissions)
        cpu = time.process_time() - t0
    finally:
        psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
    return result, cpu, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=1000)
    parser.add_argument("--top", type=int, default=12, help="statements listed")
    _pg.add_argument(parser)
    args = parser.parse_args()
    n = args.submissions
    with _pg.server(args.pg) as server:
        result, cpu, counts = counted_run(server.url(), n)
    total = sum(counts.values())
    print(
        f"{n} submissions over {_peer_cases.WORKERS} conversations: {result['per_s']:.0f} settled/s"
    )
    print(f"process CPU {cpu / n * 1000:.2f} ms and {total / n:.2f} statements per submission")
    for text, count in counts.most_common(args.top):
        print(f"  {count / n:6.2f}  {text}")


if __name__ == "__main__":
    main()
