"""Inputs from outside: webhook admission rate, and how late scheduled occurrences fire.

Webhooks: starts ``hearth serve inputs:app`` (this file) on a fresh SQLite file
(``synchronous=FULL``), then N keep-alive clients POST signed deliveries (``hearth.channels.hmac``,
a fresh delivery id each, one dispatch each) to ``/channels/hooks`` as fast as the server answers;
then the same clients POST plain messages to ``/agents/...`` for the ratio, in the same run.

Schedules: runs the app in-process on a SQLite file with S schedules firing every minute, on the
real clock, for M minute boundaries, and reports how long after its time each occurrence was
admitted (``accepted_at - scheduled_for``): p50, p99, max.

    .venv/bin/python bench/inputs.py                        # both, 64 clients, 3 boundaries
    .venv/bin/python bench/inputs.py --only webhooks --requests 10000
    .venv/bin/python bench/inputs.py --only schedules --schedules 100 --minutes 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from admission import start_server

import hearth
from hearth.channels import sign
from hearth.testing import ScriptedModel, stall

SECRET = "bench-secret"


@hearth.agent
def queued(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/stall")
    return ""


def route(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
    return [hearth.Dispatch(queued, delivery.data["to"], message="hello")]


def schedules(count: int) -> list[hearth.Schedule]:
    return [
        hearth.Schedule(f"s{n}", queued, f"sched-{n}", cron="* * * * *", message="tick")
        for n in range(count)
    ]


app = hearth.App(
    [queued],
    channels=[hearth.Channel("hooks", verify=hearth.channels.hmac(SECRET), receive=route)],
    providers=[ScriptedModel("stall", [stall()], repeat_last=True)],
)


async def client(
    index: int,
    host: str,
    port: int,
    webhook: bool,
    n: int,
    deadline: float,
    latencies: list[float],
    errors: list[str],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0
    try:
        while time.monotonic() < deadline and len(latencies) < n:
            sent += 1
            if webhook:
                body = json.dumps({"to": f"hook-{index}"}).encode()
                path = "/channels/hooks"
                extra = f"X-Delivery-Id: d-{index}-{sent}\r\nX-Signature: {sign(SECRET, body)}\r\n"
            else:
                body = json.dumps({"message": "hello"}).encode()
                path = f"/agents/queued/direct-{index}"
                extra = ""
            request = (
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"{extra}Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if status != 202:
                errors.append(str(status))
    finally:
        writer.close()


async def load(
    host: str, port: int, webhook: bool, clients: int, total: int
) -> tuple[float, float]:
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    deadline = time.monotonic() + 60
    offset = 1000 if webhook else 0
    await asyncio.gather(
        *(
            client(offset + i, host, port, webhook, total, deadline, latencies, errors)
            for i in range(clients)
        )
    )
    elapsed = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[min(int(0.99 * len(latencies)), len(latencies) - 1)] * 1000
    what = "webhook deliveries" if webhook else "direct POSTs"
    rate = len(latencies) / elapsed
    print(f"{what}: {len(latencies)} in {elapsed:.2f} s, {rate:,.0f}/s, p99 {p99:.1f} ms")
    if errors:
        print(f"  non-202 answers: {len(errors)} (first: {errors[0]})")
    return rate, p99


def webhooks(clients: int, total: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="hearth-bench-inputs-"))
    proc, host, port = start_server(
        f"sqlite:///{folder / 'bench.db'}", folder / "server.log", app="inputs:app"
    )
    try:
        asyncio.run(load(host, port, True, 4, 400))  # warm up
        hooks, _ = asyncio.run(load(host, port, True, clients, total))
        direct, _ = asyncio.run(load(host, port, False, clients, total))
        print(f"webhook rate / direct admission rate: {hooks / direct:.2f}")
    finally:
        proc.terminate()
        proc.wait(30)


async def firing(count: int, minutes: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="hearth-bench-sched-"))
    timed = hearth.App(
        [queued],
        schedules=schedules(count),
        db=f"sqlite:///{folder / 'bench.db'}",
        providers=[ScriptedModel("stall", [stall()], repeat_last=True)],
    )
    async with timed.run() as rt:
        left = 60 - time.time() % 60
        print(f"schedules: {count} every minute; waiting {left + 60 * (minutes - 1):.0f} s ...")
        await asyncio.sleep(left + 60 * (minutes - 1) + 2)
        subs = await rt.submissions()
    delays = sorted(
        s.accepted_at - datetime.fromisoformat(s.payload["scheduled_for"]).timestamp() for s in subs
    )
    if not delays:
        print("no occurrence fired")
        return
    p = lambda q: delays[min(int(q * len(delays)), len(delays) - 1)] * 1000  # noqa: E731
    print(
        f"firing delay over {len(delays)} occurrences: p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms,"
        f" max {delays[-1] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["webhooks", "schedules"], default=None)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--minutes", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.only in (None, "webhooks"):
        webhooks(args.clients, args.requests)
    if args.only in (None, "schedules"):
        asyncio.run(firing(args.schedules, args.minutes))


if __name__ == "__main__":
    main()
