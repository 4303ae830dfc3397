"""Does a turn get slower as a conversation grows? Per-turn time at 100 vs 10,000 records.

SPEC §13's growth row: rebuilding a model's context costs O(records since the last compaction),
and reading from an offset costs O(records returned). For each history size N this makes a
conversation on a SQLite file (``synchronous=FULL``) holding N old user messages followed by a
compaction record that covers them, then times whole turns (``rt.dispatch`` + ``rt.read`` of a
one-reply submission, scripted instant model) and reads of the last 10 records from an offset.
Printed: medians and p99s per size, and each size's median divided by the smallest size's.

    .venv/bin/python bench/growth.py                       # 100 and 10,000 records
    .venv/bin/python bench/growth.py --sizes 100,100000    # the long form

A ratio near 1.0 means the cost does not grow with the history. Nothing is asserted; the
counting test ``tests/perf/test_work_counts.py`` checks records read per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import hearth
from hearth.records import Compaction, UserMessage
from hearth.testing import ScriptedModel, reply

CHUNK = 500


@hearth.agent
def grower(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/grower")
    return ""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(size: int, turns: int, db: str) -> tuple[list[float], list[float]]:
    """Seconds per turn and per 10-record read, on a conversation of ``size`` old records."""
    model = ScriptedModel("grower", lambda _: reply("ok"))
    app = hearth.App([grower], db=db, providers=[model])
    async with app.run() as rt:
        first = await rt.dispatch("grower", "long", "start")
        await rt.read(first, timeout=60)
        conversation = first.conversation_id
        last = 0
        for start in range(0, size, CHUNK):
            batch = [
                UserMessage(id=f"old{i}", message_id=f"old{i}", content="x" * 40).stamped(
                    first.id, 1
                )
                for i in range(start, min(size, start + CHUNK))
            ]
            last = (await rt.store.append(conversation, batch))[-1]
        summary = Compaction(id="cmp", summary="the old messages", first_kept_offset=last + 1)
        await rt.store.append(conversation, [summary.stamped(first.id, 1)])
        for i in range(5):  # warm up, untimed
            await rt.read(await rt.dispatch("grower", "long", f"warm{i}"), timeout=60)
        per_turn: list[float] = []
        for i in range(turns):
            t0 = time.perf_counter()
            await rt.read(await rt.dispatch("grower", "long", f"turn{i}"), timeout=60)
            per_turn.append(time.perf_counter() - t0)
        per_read: list[float] = []
        for _ in range(turns):
            info = await rt.store.get_conversation(conversation)
            assert info is not None
            tail = info.last_offset - 10
            t0 = time.perf_counter()
            found = await rt.store.read(conversation, tail)
            per_read.append(time.perf_counter() - t0)
            assert len(found) == 10, len(found)
    return per_turn, per_read


async def main(sizes: list[int], turns: int) -> None:
    rows: list[tuple[int, float, float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            per_turn, per_read = await measure(size, turns, str(Path(tmp) / f"g{size}.db"))
            rows.append(
                (
                    size,
                    statistics.median(per_turn) * 1e3,
                    pct(per_turn, 0.99) * 1e3,
                    statistics.median(per_read) * 1e3,
                    pct(per_read, 0.99) * 1e3,
                )
            )
    base_turn, base_read = rows[0][1], rows[0][3]
    print(f"{turns} turns per size, SQLite synchronous=FULL, scripted instant model")
    print("records   turn median  turn p99   ratio   read-10 median  read-10 p99   ratio")
    for size, turn, turn99, read, read99 in rows:
        print(
            f"{size:>7}   {turn:8.3f} ms {turn99:8.3f} ms  {turn / base_turn:5.2f}×"
            f"   {read:9.3f} ms   {read99:8.3f} ms   {read / base_read:5.2f}×"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,10000", help="history sizes, comma-separated")
    parser.add_argument("--turns", type=int, default=200, help="timed turns per size")
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.turns))
