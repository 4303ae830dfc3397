"""Admission throughput and latency: HTTP POST → 202 against a real ``hearth serve``.

Starts ``hearth serve admission:app`` (this file) as a child process on a fresh SQLite file with
``synchronous=FULL``, then runs N concurrent keep-alive clients that POST messages as fast as the
server answers. The clients speak raw HTTP/1.1 over asyncio sockets so that the measuring side
costs little next to the server (both share the machine). Prints the rate, p50 and p99.

    .venv/bin/python bench/admission.py                  # 64 clients, 20,000 POSTs
    .venv/bin/python bench/admission.py --with-work      # the admitted messages also run
    .venv/bin/python bench/admission.py --postgres --processes 2   # 2 servers, one PostgreSQL DB

By default the agent's model never answers, so each conversation's first message stays running
and every later one queues behind it: the figures are admission alone. With ``--with-work`` the
model answers at once and the same process runs every admitted submission to its settlement.

With ``--wrk`` the load comes from Debian's ``wrk`` (C, one thread per core) instead of the
asyncio clients, with a Lua script that spreads the POSTs over 64 conversations per connection;
its latency distribution is printed as wrk reports it (``apt-get install wrk``).

With ``--postgres`` the database is a fresh schema on a throwaway PostgreSQL cluster with default
durability (or on the server ``--pg URL`` names), and ``--processes N`` starts N ``hearth serve``
processes on it; client ``i`` talks to process ``i mod N`` (what a load balancer would do).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _pg

import hearth
from hearth.testing import ScriptedModel, reply, stall


@hearth.agent
def queued(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/stall")
    return ""


@hearth.agent
def instant(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/instant")
    return ""


app = hearth.App(
    [queued, instant],
    providers=[
        ScriptedModel("stall", [stall()], repeat_last=True),
        ScriptedModel("instant", [reply("ok")], repeat_last=True),
    ],
)


def start_server(
    db: str, log: Path, app: str = "admission:app"
) -> tuple[subprocess.Popen[str], str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
    here = str(Path(__file__).resolve().parent)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hearth",
            "serve",
            app,
            "--app-dir",
            here,
            "--db",
            db,
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"http://([\d.]+):(\d+)", line)
    if not found:
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r} {log.read_text()[-2000:]}")
    return proc, found.group(1), int(found.group(2))


async def client(
    index: int,
    host: str,
    port: int,
    agent: str,
    n: int,
    deadline: float,
    latencies: list[float],
    errors: list[str],
) -> None:
    """One keep-alive connection POSTing to its own conversation until ``n`` answers in all."""
    reader, writer = await asyncio.open_connection(host, port)
    conversation = f"bench-{agent}-{index}"
    body = json.dumps({"message": "hello"}).encode()
    request = (
        f"POST /agents/{agent}/{conversation} HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    try:
        while time.monotonic() < deadline and len(latencies) < n:
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


async def measure(
    servers: list[tuple[str, int]], agent: str, clients: int, total: int, limit_s: float
) -> None:
    warm: list[float] = []
    warmup = time.monotonic() + 5
    await asyncio.gather(
        *(client(-i, *servers[i % len(servers)], agent, 400, warmup, warm, []) for i in range(1, 5))
    )
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    deadline = time.monotonic() + limit_s
    await asyncio.gather(
        *(
            client(i, *servers[i % len(servers)], agent, total, deadline, latencies, errors)
            for i in range(clients)
        )
    )
    elapsed = time.perf_counter() - started
    latencies.sort()
    p = lambda q: latencies[min(int(q * len(latencies)), len(latencies) - 1)] * 1000  # noqa: E731
    print(
        f"admissions: {len(latencies)} in {elapsed:.2f} s by {clients} clients ({agent})"
        f" on {len(servers)} server process(es)"
    )
    print(f"rate: {len(latencies) / elapsed:,.0f}/s")
    print(
        f"latency: p50 {p(0.50):.1f} ms, p99 {p(0.99):.1f} ms, max {latencies[-1] * 1000:.1f} ms,"
        f" mean {statistics.fmean(latencies) * 1000:.1f} ms"
    )
    if errors:
        print(f"non-202 answers: {len(errors)} (first: {errors[0]})")


WRK_SCRIPT = """
local n = 0
request = function()
    n = n + 1
    local path = string.format("/agents/%s/wrk-%d", AGENT, n % 64)
    return wrk.format("POST", path, {["Content-Type"] = "application/json"},
        '{"message": "hello"}')
end
response = function(status, headers, body)
    if status ~= 202 then errors = (errors or 0) + 1 end
end
"""


def run_wrk(servers: list[tuple[str, int]], agent: str, clients: int, seconds: float) -> None:
    """Drive the first server with wrk; print its summary (rate and latency percentiles)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk (or drop --wrk)")
    host, port = servers[0]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(f'AGENT = "{agent}"\n' + WRK_SCRIPT)
    threads = str(min(clients, os.cpu_count() or 1))
    command = ["wrk", "-t", threads, "-c", str(clients), "-d", f"{seconds:.0f}s", "--latency"]
    subprocess.run([*command, "-s", f.name, f"http://{host}:{port}"], check=True)
    os.unlink(f.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20_000, help="stop after this many")
    parser.add_argument("--seconds", type=float, default=30.0, help="or after this long")
    parser.add_argument("--with-work", action="store_true", help="run what is admitted too")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    parser.add_argument("--processes", type=int, default=1, help="servers (PostgreSQL only)")
    parser.add_argument("--wrk", action="store_true", help="load from wrk (Debian) instead")
    _pg.add_argument(parser)
    args = parser.parse_args()
    if args.pg:
        args.postgres = True
    if args.processes > 1 and not args.postgres:
        parser.error("several processes share a database on PostgreSQL only (--postgres)")
    folder = Path(tempfile.mkdtemp(prefix="hearth-bench-"))
    with contextlib.ExitStack() as stack:
        if args.postgres:
            server = stack.enter_context(_pg.server(args.pg))
            db = server.url()
            where = f"PostgreSQL ({server.settings()})"
        else:
            db = f"sqlite:///{folder / 'hearth.db'}"
            where = f"{folder / 'hearth.db'} (SQLite, synchronous=FULL)"
        procs = []
        try:
            for i in range(args.processes):
                procs.append(start_server(db, folder / f"server{i}.log"))
            agent = "instant" if args.with_work else "queued"
            servers = [(host, port) for _, host, port in procs]
            if args.wrk:
                run_wrk(servers, agent, args.clients, min(args.seconds, 30.0))
            else:
                asyncio.run(measure(servers, agent, args.clients, args.requests, args.seconds))
        finally:
            for proc, _, _ in procs:
                proc.terminate()
            for proc, _, _ in procs:
                proc.wait(30)
        print(f"database: {where}")


if __name__ == "__main__":
    main()
