"""Median overhead of ``step.do`` on a SQLite file with ``synchronous=FULL``.

One durable tool call runs N trivial steps; each ``step.do`` durably records its value (one
fenced append and one fsync'd commit) before returning it. Printed: median, p90 and p99 of the
time spent inside ``step.do`` minus the time of the step function itself (which does nothing).

    .venv/bin/python bench/step_overhead.py --steps 2000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import hearth
from hearth.testing import ScriptedModel, call, calls, reply

samples: list[float] = []


@hearth.tool(durable=True)
async def many_steps(n: int, ctx: hearth.ToolContext) -> int:
    """Run n empty steps."""
    for i in range(n):
        t0 = time.perf_counter()
        await ctx.step.do(f"s{i}", lambda: 1)
        samples.append(time.perf_counter() - t0)
    return n


@hearth.agent
def bench(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/bench")
    ctx.use_tool(many_steps)
    return ""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure_step_do(steps: int, db: str) -> list[float]:
    """Seconds spent in each of ``steps`` ``step.do`` calls of one durable tool call on ``db``."""
    samples.clear()
    model = ScriptedModel("bench", [calls(call("many_steps", n=steps)), reply("done")])
    app = hearth.App([bench], db=db, providers=[model])
    async with app.run() as rt:
        await rt.read(await rt.dispatch("bench", "b", "go"), timeout=600)
    return list(samples)


async def main(steps: int, sync: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        measured = await measure_step_do(
            steps, f"sqlite:///{Path(tmp) / 'bench.db'}?synchronous={sync}"
        )
    warm = measured[50:] if len(measured) > 100 else measured
    ms = [s * 1000 for s in warm]
    print(f"step.do on SQLite synchronous={sync}: {len(ms)} steps")
    median, p90, p99 = statistics.median(ms), pct(ms, 0.9), pct(ms, 0.99)
    print(f"  median {median:.3f} ms   p90 {p90:.3f} ms   p99 {p99:.3f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"])
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.synchronous))
