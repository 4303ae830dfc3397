"""Admission with attachments: HTTP POST (multipart) → 202 against a real ``hearth serve``.

Starts ``hearth serve admission:app`` (the app of ``bench/admission.py``: its model never answers,
so the figures are admission alone) on a fresh SQLite file with ``synchronous=FULL``, then runs,
one after the other:

- ``plain``: a message without files (JSON), the baseline;
- ``1 MiB new`` / ``10 MiB new``: a message with one file whose bytes differ on every request
  (each is stored);
- ``1 MiB same`` / ``10 MiB same``: the same bytes on every request (stored once; each later
  admission only references them: the dedupe path).

Each case prints requests/s, p50 and p99 latency, and the upload rate. Concurrent keep-alive
clients speak raw HTTP/1.1 over asyncio sockets so that the measuring side stays cheap.

    .venv/bin/python bench/attachments.py               # 8 clients
    .venv/bin/python bench/attachments.py --quick       # a short run, to check it works
    .venv/bin/python bench/attachments.py --postgres    # a throwaway PostgreSQL cluster
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _pg
from admission import start_server

MiB = 1024 * 1024
BOUNDARY = "hearthbenchboundary"
FORM_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def multipart(message: str, name: str, data: bytes) -> bytes:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="message"\r\n\r\n{message}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def request(host: str, path: str, body: bytes, content_type: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


Body = Callable[[int], tuple[bytes, str]]  # request number → (body, content type)


def plain_body(n: int) -> tuple[bytes, str]:
    return json.dumps({"message": f"hello {n}"}).encode(), "application/json"


def file_body(size: int, *, same: bool) -> Body:
    block = os.urandom(size)

    def make(n: int) -> tuple[bytes, str]:
        data = block if same else n.to_bytes(8, "big") + block[8:]
        return multipart(
            "see the file", "file.bin", data
        ), f"multipart/form-data; boundary={BOUNDARY}"

    return make


async def client(
    index: int,
    host: str,
    port: int,
    make: Body,
    counter: list[int],
    total: int,
    latencies: list[float],
    errors: list[str],
) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0
    path = f"/agents/queued/att-{index}"
    try:
        while counter[0] < total:
            counter[0] += 1
            body, content_type = make(counter[0] + index * 1_000_000)
            message = request(host, path, body, content_type)
            t0 = time.perf_counter()
            writer.write(message)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            sent += len(body)
            if status != 202:
                errors.append(str(status))
    finally:
        writer.close()
    return sent


async def run_case(
    name: str, host: str, port: int, make: Body, clients: int, total: int
) -> dict[str, float]:
    latencies: list[float] = []
    errors: list[str] = []
    counter = [0]
    started = time.perf_counter()
    sent = await asyncio.gather(
        *(client(i, host, port, make, counter, total, latencies, errors) for i in range(clients))
    )
    elapsed = time.perf_counter() - started
    latencies.sort()

    def p(q: float) -> float:
        return latencies[min(int(q * len(latencies)), len(latencies) - 1)] * 1000

    row = {
        "requests": len(latencies),
        "rate": len(latencies) / elapsed,
        "p50_ms": p(0.50),
        "p99_ms": p(0.99),
        "mib_s": sum(sent) / MiB / elapsed,
        "errors": len(errors),
    }
    print(
        f"{name:<12} {row['requests']:>6.0f} req  {row['rate']:>9,.1f}/s"
        f"  p50 {row['p50_ms']:>8.1f} ms  p99 {row['p99_ms']:>8.1f} ms"
        f"  {row['mib_s']:>7.1f} MiB/s"
        + (f"  non-202: {len(errors)} ({errors[0]})" if errors else "")
    )
    return row


async def measure(host: str, port: int, clients: int, scale: float) -> None:
    cases: list[tuple[str, Body, int]] = [
        ("plain", plain_body, int(4000 * scale)),
        ("1 MiB new", file_body(MiB, same=False), int(400 * scale)),
        ("1 MiB same", file_body(MiB, same=True), int(400 * scale)),
        ("10 MiB new", file_body(10 * MiB, same=False), int(60 * scale)),
        ("10 MiB same", file_body(10 * MiB, same=True), int(60 * scale)),
    ]
    for name, make, total in cases:
        await run_case(name, host, port, make, clients, max(total, clients))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="a few requests per case")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    _pg.add_argument(parser)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="hearth-bench-"))
    with contextlib.ExitStack() as stack:
        if args.postgres or args.pg:
            server = stack.enter_context(_pg.server(args.pg))
            db, where = server.url(), f"PostgreSQL ({server.settings()})"
        else:
            db = f"sqlite:///{folder / 'hearth.db'}"
            where = f"{folder / 'hearth.db'} (SQLite, synchronous=FULL)"
        proc, host, port = start_server(db, folder / "server.log")
        try:
            asyncio.run(measure(host, port, args.clients, 0.02 if args.quick else 1.0))
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"database: {where}; {args.clients} clients")


if __name__ == "__main__":
    main()
