"""Many SSE followers of one conversation: how late each streamed delta reaches each of them.

Starts ``hearth serve sse_followers:app`` (this file) on a fresh SQLite file, connects N
followers (default 1,000) to ``GET /agents/talker/room/stream`` with raw asyncio sockets (cheap
next to the server on a shared machine; ``RLIMIT_NOFILE`` is raised to fit), then sends one
message whose scripted answer streams 50 words, 20 ms apart (the runner writes them as text
delta records, several words to a record when they come faster than every 50 ms). A delta
record's lateness is the time it arrives at a follower minus its ``at`` stamp (same machine
clock, millisecond stamps). Prints p50/p99/max over every (follower, delta record) and how many
followers got all 50 words before the settlement.

    .venv/bin/python bench/sse_followers.py                     # 1,000 followers
    .venv/bin/python bench/sse_followers.py --followers 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import tempfile
import time
from datetime import datetime
from pathlib import Path

from admission import start_server

import hearth
from hearth.testing import ScriptedModel, stream

DELTAS = 50


@hearth.agent
def talker(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/talk")
    return ""


app = hearth.App(
    [talker],
    providers=[
        ScriptedModel(
            "talk", [stream(*(f"w{i} " for i in range(DELTAS)), delay=0.02)], repeat_last=True
        )
    ],
)


def stamp(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


async def follower(
    host: str, port: int, offset: int, ready: asyncio.Event, lateness: list[float]
) -> int:
    """Follow the room until its submission settles; return how many streamed words arrived
    (the runner batches text deltas into records every 50 ms, so a record may hold several)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET /agents/talker/room/stream?offset={offset} HTTP/1.1\r\nHost: {host}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await reader.readuntil(b"\r\n\r\n")
    ready.set()
    words = 0
    try:
        while True:
            line = await reader.readline()
            if not line or b'"submission_settled"' in line:
                break
            if b'"assistant_text_delta"' not in line:
                continue
            arrived = time.time()
            # a chunked body may prefix the line with a chunk size; the JSON starts at "{"
            record = json.loads(line[line.index(b"{") :])
            lateness.append(arrived - stamp(record["at"]))
            words += len(record["delta"].split())
    finally:
        writer.close()
    return words


async def measure(host: str, port: int, followers: int, deltas: int) -> None:
    import hearth.client

    async with hearth.client.AsyncClient(f"http://{host}:{port}") as client:
        room = client.conversation("talker", "room")
        await room.read(await room.send("warm up"), timeout=60)  # it must exist to be followed
        offset = (await room.snapshot())["offset"]
    lateness: list[float] = []
    readies = [asyncio.Event() for _ in range(followers)]
    tasks = []
    for ready in readies:  # connect in small waves so the accept queue keeps up
        tasks.append(asyncio.create_task(follower(host, port, offset, ready, lateness)))
        if len(tasks) % 50 == 0:
            await asyncio.sleep(0.05)
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
    print(f"{followers} followers connected")
    async with hearth.client.AsyncClient(f"http://{host}:{port}") as client:
        await client.conversation("talker", "room").send("talk")
    got = await asyncio.wait_for(asyncio.gather(*tasks), 300)
    ms = sorted(x * 1000 for x in lateness)
    pct = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    complete = sum(1 for g in got if g == deltas)
    print(
        f"delta records received: {len(ms)} ({len(ms) / followers:.1f} per follower);"
        f" followers that got all {deltas} words: {complete} of {followers}"
    )
    print(f"lateness: p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, max {ms[-1]:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--followers", type=int, default=1000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.followers * 2 + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    folder = Path(tempfile.mkdtemp(prefix="hearth-sse-"))
    proc, host, port = start_server(
        f"sqlite:///{folder / 'hearth.db'}", folder / "server.log", "sse_followers:app"
    )
    try:
        asyncio.run(measure(host, port, args.followers, DELTAS))
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"server log: {folder / 'server.log'}")


if __name__ == "__main__":
    main()
