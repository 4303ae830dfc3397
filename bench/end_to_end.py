"""Submissions settled per second in-process: scripted instant model, one tool call each.

.venv/bin/python bench/end_to_end.py --submissions 2000 --conversations 200
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import hearth
from hearth.providers.base import ModelRequest, ToolResult
from hearth.testing import ScriptedModel, Step, call, calls, reply


@hearth.tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return key.upper()


@hearth.agent
def worker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/bench")
    ctx.use_tool(lookup)
    return ""


def script(request: ModelRequest) -> Step:
    if isinstance(request.messages[-1], ToolResult):
        return reply("done")
    return calls(call("lookup", key="k"))


async def main(submissions: int, conversations: int, sync: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'bench.db'}?synchronous={sync}"
        app = hearth.App([worker], db=db, providers=[ScriptedModel("bench", script)])
        async with app.run() as rt:
            start = time.perf_counter()
            receipts = await asyncio.gather(
                *(
                    rt.dispatch("worker", f"c{i % conversations}", f"m{i}")
                    for i in range(submissions)
                )
            )
            await asyncio.gather(*(rt.read(r, timeout=600) for r in receipts))
            elapsed = time.perf_counter() - start
            commits = getattr(rt.store, "commits", None)
    print(
        f"{submissions} submissions over {conversations} conversations, SQLite {sync}: "
        f"{elapsed:.2f} s, {submissions / elapsed:.0f} settled/s"
        + (f", {commits} commits" if commits is not None else "")
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--submissions", type=int, default=2000)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"])
    args = parser.parse_args()
    asyncio.run(main(args.submissions, args.conversations, args.synchronous))
