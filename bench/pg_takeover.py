"""Takeover on PostgreSQL: how long until another process settles the work of an owner that died
(or froze) in the middle of a tool call. SPEC §13: a live peer takes over within lease + scan;
a restarted process resumes within 1 s of being ready.

Child processes (this file with ``--child``) run ``App([sleeper], db=URL).run()`` with short
``--lease-s``/``--heartbeat-s``/``--scan-s``. The agent calls one durable tool, ``hang``, whose
first step records the pid of the process running it; in that process the tool then writes a
marker and hangs, while in any later process (where the recorded pid is another one) it returns
at once and the submission completes. Each trial admits one message (from the bench's own
store), waits for the marker, and then, by ``--mode``:

* ``kill``: SIGKILL the owner (reaped at once) while a live peer runs. The peer's periodic
  reconcile (every scan) sees that the owner is a dead process of this host and expires its
  lease; it does not wait for the lease to run out.
* ``stop``: SIGSTOP the owner (a frozen process, or one on another host that cannot be seen to be
  dead): the peer claims the work once the lease has expired, at its next scan.
* ``restart``: one process only; SIGKILL it and start a new one, which reclaims the dead
  predecessor's work at once when it starts. Also printed: the time from its ``ready``.

The clock runs from the signal until the bench reads the submission ``completed`` (settlement
event or a read every 20 ms). The killed or frozen child is replaced before the next trial.

    .venv/bin/python bench/pg_takeover.py --quick                   # 3 trials per mode
    .venv/bin/python bench/pg_takeover.py --trials 10 --lease-s 5 --heartbeat-s 1 --scan-s 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _pg

import hearth
from hearth.providers.base import ModelRequest, ToolResult
from hearth.store import NewSubmission, Store, open_store
from hearth.testing import ScriptedModel, Step, call, calls, reply


@hearth.tool(durable=True)
async def hang(ctx: hearth.ToolContext) -> str:
    """Hang in the first process that runs this call; return at once in any later one."""
    first = await ctx.step.do("first-pid", os.getpid)
    if first != os.getpid():
        return "taken over"
    marker = Path(os.environ["BENCH_MARKERS"]) / ctx.conversation_id.replace("/", "_")
    marker.write_text(str(os.getpid()))
    await asyncio.Event().wait()
    return "unreachable"


@hearth.agent
def sleeper(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/takeover")
    ctx.use_tool(hang)
    return ""


def script(request: ModelRequest) -> Step:
    if isinstance(request.messages[-1], ToolResult):
        return reply("done")
    return calls(call("hang"))


async def child(url: str) -> None:
    app = hearth.App([sleeper], db=url, providers=[ScriptedModel("takeover", script)])
    await _pg.serve_until_terminated(app)


class Children:
    def __init__(self, url: str, markers: Path, args: argparse.Namespace) -> None:
        self.url = url
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
        self.env.update(
            BENCH_MARKERS=str(markers),
            HEARTH_LEASE_S=str(args.lease_s),
            HEARTH_HEARTBEAT_S=str(args.heartbeat_s),
            HEARTH_SCAN_S=str(args.scan_s),
        )
        self.procs: dict[int, subprocess.Popen[str]] = {}

    def start(self) -> float:
        """Start one child; return the perf_counter time at which it said it was ready."""
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", self.url],
            stdout=subprocess.PIPE,
            env=self.env,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        ready = time.perf_counter()
        if not line.startswith("ready"):
            raise SystemExit(f"a child did not start: {line!r}")
        self.procs[proc.pid] = proc
        return ready

    def signal(self, pid: int, sig: int) -> None:
        self.procs[pid].send_signal(sig)
        if sig == signal.SIGKILL:
            self.procs.pop(pid).wait()  # reaped: a zombie would still look alive

    def kill(self, pid: int) -> None:
        self.signal(pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


async def wait_completed(store: Store, submission_id: str, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        woken = store.events.watch_settled(submission_id)
        try:
            sub = await store.get_submission(submission_id)
            assert sub is not None
            if sub.outcome is not None:
                return sub.outcome == "completed"
            await asyncio.wait({woken}, timeout=0.02)
        finally:
            store.events.unwatch_settled(submission_id, woken)
    return False


def read_marker(path: Path) -> int | None:
    text = path.read_text() if path.exists() else ""
    return int(text) if text else None


async def wait_marker(path: Path, limit_s: float = 30.0) -> int:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        pid = read_marker(path)
        if pid is not None:
            return pid
        await asyncio.sleep(0.01)
    raise SystemExit(f"no process started the tool call ({path.name})")


async def run_mode(
    mode: str, server: _pg.Server, args: argparse.Namespace, markers: Path
) -> list[tuple[float, float | None]]:
    url = server.url()
    children = Children(url, markers, args)
    store = open_store(url)
    await store.open()
    results: list[tuple[float, float | None]] = []
    try:
        for _ in range(1 if mode == "restart" else 2):
            await asyncio.to_thread(children.start)
        for i in range(args.trials):
            new = NewSubmission(f"sleeper/{mode}{i}", "sleeper", "message", {"message": "go"})
            sid = (await store.admit(new)).submission.id
            pid = await wait_marker(markers / new.conversation_id.replace("/", "_"))
            await asyncio.sleep(0.1)
            t0 = time.perf_counter()
            ready: float | None = None
            if mode == "stop":
                children.signal(pid, signal.SIGSTOP)
            else:
                children.kill(pid)
            if mode == "restart":
                ready = await asyncio.to_thread(children.start)
            limit = args.lease_s + 2 * args.scan_s + 30
            if not await wait_completed(store, sid, limit):
                raise SystemExit(f"{mode}: the submission was not completed within {limit} s")
            done = time.perf_counter()
            results.append((done - t0, None if ready is None else done - ready))
            print(f"  {mode} #{i + 1}: completed {done - t0:.3f} s after the signal", flush=True)
            if mode == "stop":
                children.kill(pid)
            if mode != "restart":
                await asyncio.to_thread(children.start)  # back to two processes
    finally:
        await store.close()
        children.stop_all()
    return results


def main(args: argparse.Namespace) -> None:
    table: list[tuple[str, list[tuple[float, float | None]]]] = []
    with _pg.server(args.pg) as server, tempfile.TemporaryDirectory() as d:
        print(f"PostgreSQL: {server.settings()}")
        print(f"lease_s={args.lease_s} heartbeat_s={args.heartbeat_s} scan_s={args.scan_s}")
        for mode in args.modes:
            table.append((mode, asyncio.run(run_mode(mode, server, args, Path(d)))))
    print()
    print(f"{'mode':<8} {'n':>3} {'median s':>8} {'min s':>6} {'max s':>6}  from ready (restart)")
    for mode, results in table:
        times = [r[0] for r in results]
        from_ready = [r[1] for r in results if r[1] is not None]
        extra = (
            f"median {statistics.median(from_ready):.3f} s, max {max(from_ready):.3f} s"
            if from_ready
            else "-"
        )
        print(
            f"{mode:<8} {len(times):>3} {statistics.median(times):>8.3f} {min(times):>6.3f}"
            f" {max(times):>6.3f}  {extra}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["kill", "stop", "restart"])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--lease-s", type=float, default=5.0)
    parser.add_argument("--heartbeat-s", type=float, default=1.0)
    parser.add_argument("--scan-s", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="3 trials per mode")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    _pg.add_argument(parser)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child))
        sys.exit(0)
    if args.quick:
        args.trials = 3
    for m in args.modes:
        if m not in ("kill", "stop", "restart"):
            parser.error(f"unknown mode {m!r}")
    main(args)
