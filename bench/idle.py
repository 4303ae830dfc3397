"""What idle conversations cost: tasks held and memory, after each has had one exchange.

.venv/bin/python bench/idle.py --conversations 10000

Every conversation gets one message and its reply (scripted instant model), then sits idle. The
benchmark prints the asyncio tasks alive, the waiters the store's event hub still holds, the
Python objects alive and the process's RSS, after a warm-up of a few conversations and again after
all of them. The scripted model's log of requests (kept for tests) is emptied as it goes, so it
does not count; SQLite's page cache does (it grows with the database, up to its ``cache_size`` of
32 MB), so RSS growth is an upper bound on what idle conversations cost.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import tempfile
import time
from pathlib import Path

import hearth
from hearth.runtime.runtime import Runtime
from hearth.testing import ScriptedModel, reply


@hearth.agent
def idle(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/idle")
    return ""


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def held(rt: Runtime) -> str:
    gc.collect()
    events = rt.store.events
    waiters = len(events._appended) + len(events._settled)
    return (
        f"tasks {len(asyncio.all_tasks())}, event-hub keys {waiters}, "
        f"claims {rt.coordinator.running}, Python objects {len(gc.get_objects())}, "
        f"RSS {rss_mb():.1f} MB"
    )


MODEL = ScriptedModel("idle", lambda _: reply("hi"))


async def converse(rt: Runtime, first: int, last: int, batch: int = 500) -> None:
    for start in range(first, last, batch):
        ids = range(start, min(start + batch, last))
        receipts = [await rt.dispatch("idle", f"c{i}", "hello") for i in ids]
        await asyncio.gather(*(rt.read(r, timeout=600) for r in receipts))
        MODEL.requests.clear()


async def main(conversations: int, warmup: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app = hearth.App(
            [idle],
            db=f"sqlite:///{Path(tmp) / 'idle.db'}",
            providers=[MODEL],
        )
        async with app.run() as rt:
            await converse(rt, 0, warmup)
            await asyncio.sleep(0.2)
            trim_heap()
            base_rss = rss_mb()
            print(f"after {warmup} conversations: {held(rt)}")
            start = time.perf_counter()
            await converse(rt, warmup, conversations)
            elapsed = time.perf_counter() - start
            await asyncio.sleep(0.2)
            trim_heap()
            print(f"after {conversations} conversations ({elapsed:.1f} s): {held(rt)}")
            print(
                f"RSS growth for {conversations - warmup} idle conversations: "
                f"{rss_mb() - base_rss:.1f} MB"
            )
            # Separate SQLite's page cache (it grows with the file, not with what is held) from
            # the rest: empty it, hand freed heap back to the system, and look again.
            await rt.store._read(lambda conn: conn.execute("PRAGMA shrink_memory").fetchall())
            trim_heap()
            size = files_mb(Path(tmp))
            print(
                f"after emptying SQLite's page cache (database files {size:.1f} MB): RSS growth "
                f"{rss_mb() - base_rss:.1f} MB"
            )


def files_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir()) / 2**20


def trim_heap() -> None:
    """Return free heap pages to the system (glibc), so that RSS shows what is in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main(args.conversations, args.warmup))
