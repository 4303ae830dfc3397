"""The random soak: real ``hearth serve`` processes under load, SIGKILLed again and again.

    python -m hearth.testing.soak --kills 1000 --seed 7 [--servers 3] [--conversations 18]
                                  [--pg postgresql://...] [--workdir DIR]

Each server (``hearth.testing.soak_app``) runs on its own SQLite file, or all share one
PostgreSQL database (``--pg``). While the SDK drives the conversations (``_soak_load``), one
thread per server kills it over and over: at a kill point drawn from those its processes reached
so far (``HEARTH_CRASH_AT=point#N``), or from outside at a random moment of the traffic; then it
restarts it. Only real SIGKILL deaths count as kills; a planned point that did not fire in time is
counted apart (and the process is then killed from outside).

At the end every server is restarted without kills until its work is at rest, every conversation
must complete one new message, and the invariant checker judges each database together with the
tools' own log (on SQLite, run by run against what was on disk after each death). The last line
is ``kills: N, submissions: M, violations: V``; the exit status is non-zero when V > 0 or a check
failed. ``--seed`` fixes the plan (the scenarios, the kill draws); timings differ run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import hearth
from hearth.runtime.coordinator import UNEXPECTED
from hearth.testing._cli import count_from_1, postgres_url
from hearth.testing._soak_fleet import Runs, Slot
from hearth.testing._soak_load import Load
from hearth.testing._soak_report import OUTCOMES_REQUIRED, reached, situations
from hearth.testing.crash import with_store
from hearth.testing.invariants import ToolLog, Violation, check_invariants
from hearth.testing.toollog import tool_runs

POINT_WAIT_S = 5.0  # how long a planned kill point may take to fire
MIN_KILLS_FOR_COVERAGE = 200  # below this, an outcome never reached is reported, not a failure


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hearth-soak-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pg = args.pg
        shared_runs = Runs()
        self.slots: list[Slot] = []
        for i in range(args.servers):
            if self.pg:
                db, log, runs = self.pg, self.workdir / "tools.log", shared_runs
            else:
                db, log, runs = f"sqlite:///{self.workdir / f'soak-{i}.db'}", None, Runs()
            tool_log = log or self.workdir / f"tools-{i}.log"
            slot = Slot(i, db, self.workdir, runs, tool_log=tool_log, sqlite=not self.pg)
            self.slots.append(slot)
        self.lock = threading.Lock()
        self.kills: Counter[str] = Counter()  # "point" / "outside"
        self.missed: Counter[str] = Counter()  # planned points that did not fire
        self.failures: list[str] = []
        self.refused = 0  # starts refused while the database was restarting (PostgreSQL)
        self.done = threading.Event()

    # --- the kill loop --------------------------------------------------------------------------
    def total_kills(self) -> int:
        with self.lock:
            return sum(self.kills.values())

    def _killer(self, slot: Slot) -> None:
        rng = random.Random(f"{self.args.seed}:killer:{slot.index}")
        slot.start()
        while True:
            mode, pick, nth, delay = rng.random(), rng.random(), rng.random(), rng.uniform(0.3, 2.5)
            slot.prewarm()  # the next process imports while this one runs
            death = self._one_death(slot, delay)
            if death is None:  # the soak is done: this process exits gracefully
                return
            if death.returncode != -9 and self.pg and self._refused(slot):
                with self.lock:  # started while the database restarted: its one clear error
                    self.refused += 1
            elif death.returncode != -9:
                said = self._last_run_log(slot).strip().splitlines()[-3:]
                self._fail(
                    f"server {slot.index} run {death.run} exited with {death.returncode};"
                    f" its log ends: {' | '.join(said)}"
                )
            else:
                with self.lock:
                    self.kills["outside" if death.outside else "point"] += 1
                    if death.outside and death.planned:
                        self.missed[death.planned] += 1
            slot.note_on_disk(death.run)
            if self.total_kills() >= self.args.kills:
                self.done.set()
            if self.done.is_set():
                return
            seen = slot.points_seen()
            crash_at = None
            if seen and mode < 0.6:
                points = sorted(seen)
                point = points[int(pick * len(points))]
                # mostly early occurrences: a run killed soon reaches few of them
                crash_at = f"{point}#{1 + int(nth**3 * min(seen[point], 30))}"
            slot.start(crash_at)

    @staticmethod
    def _last_run_log(slot: Slot) -> str:
        """The end of what the last run wrote to its log."""
        with slot.log.open("rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 2000, 0))
            tail = f.read().decode(errors="replace")
        return tail.rpartition("--- run ")[2]

    @classmethod
    def _refused(cls, slot: Slot) -> bool:
        """Whether the last run ended by refusing to start without its database."""
        return "cannot connect to PostgreSQL" in cls._last_run_log(slot)

    def _one_death(self, slot: Slot, delay: float) -> Any:
        """Wait for the current process to die at its point, or kill it from outside; None when
        the soak ended first (then the process was stopped gracefully)."""
        end = time.monotonic() + (POINT_WAIT_S if slot.planned else 30.0)
        while time.monotonic() < end and not self.done.is_set():
            if slot.planned is None and slot.ready.is_set():
                break
            death = slot.wait(0.05)
            if death is not None:
                return death
        if self.done.is_set():
            death = slot.stop()
            slot.note_on_disk(death.run)
            return None
        if slot.planned is None:
            death = slot.wait(delay)  # heavy traffic for a random while
            if death is not None:
                return death
        slot.kill()
        return slot.wait(None)

    def _fail(self, message: str) -> None:
        print(f"FAILED: {message}", flush=True)
        with self.lock:
            self.failures.append(message)

    # --- the whole soak -------------------------------------------------------------------------
    def run(self) -> int:
        args = self.args
        cold = self._cold_start()
        print(
            f"hearth soak: seed {args.seed}, {args.servers} servers, {args.conversations}"
            f" conversations, target {args.kills} kills, db {'postgresql' if self.pg else 'sqlite'}"
            f", workdir {self.workdir}",
            flush=True,
        )
        print(f"cold start of hearth serve to ready: {cold:.2f} s", flush=True)
        load = Load.plan(args.seed, args.conversations, [s.url for s in self.slots])
        started = time.monotonic()
        killers = [threading.Thread(target=self._killer, args=(s,)) for s in self.slots]
        for t in killers:
            t.start()
        loader = threading.Thread(target=asyncio.run, args=(load.run(),), daemon=True)
        loader.start()
        last = 0.0
        restart_db = args.pg_restart_cmd
        while any(t.is_alive() for t in killers):
            time.sleep(0.5)
            if restart_db and self.total_kills() >= args.kills // 2:
                restart_db = None
                self._restart_database(args.pg_restart_cmd)
            if time.monotonic() - last > 30:
                last = time.monotonic()
                print(
                    f"  {time.monotonic() - started:6.0f} s: {self.total_kills()} kills"
                    f" ({dict(self.kills)}), missed points {self.missed.total()},"
                    f" clients saw {dict(load.seen)}",
                    flush=True,
                )
        load.stopping = True
        loader.join(30)
        elapsed = time.monotonic() - started
        print(
            f"kill phase: {self.total_kills()} kills in {elapsed:.0f} s"
            f" ({elapsed / max(self.total_kills(), 1):.2f} s per kill)",
            flush=True,
        )
        violations = self._final(load)
        for slot in self.slots:
            slot.close_warm()
        return self._report(violations, time.monotonic() - started)

    def _restart_database(self, command: str) -> None:
        """Run ``--pg-restart-cmd`` once, halfway: the database goes away under the load."""
        began = time.monotonic()
        done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            self._fail(f"the database restart command failed: {done.stderr[-500:]}")
        print(f"restarted the database mid-soak in {time.monotonic() - began:.1f} s", flush=True)

    def _cold_start(self) -> float:
        """One ``hearth serve`` from nothing to ready on a fresh database (then discarded)."""
        probe = Slot(
            99,
            self._probe_db(),
            self.workdir,
            Runs(),
            tool_log=self.workdir / "probe.log",
            sqlite=not self.pg,
        )
        began = time.monotonic()
        probe.start()
        if not probe.ready.wait(60):
            self._fail("the cold-start probe did not become ready in 60 s")
        took = time.monotonic() - began
        probe.stop()
        return took

    def _probe_db(self) -> str:
        return self.pg if self.pg else f"sqlite:///{self.workdir / 'probe.db'}"

    def _final(self, load: Load) -> list[Violation]:
        """Restart without kills, let everything settle, one new message per conversation, stop,
        then judge each database."""
        for slot in self.slots:
            slot.start()
        for slot in self.slots:
            if not slot.ready.wait(60):
                self._fail(f"server {slot.index} did not become ready for the final check")
        problems = asyncio.run(final_round(load, [s.url for s in self.slots]))
        for problem in problems:
            self._fail(problem)
        for slot in self.slots:
            death = slot.stop()
            if death.returncode != 0:
                self._fail(f"server {slot.index} exited with {death.returncode} on SIGTERM")
            slot.note_on_disk(death.run)
        if self.args.plant_fault:
            self._plant()
        found: list[Violation] = []
        dbs = {s.db: s for s in self.slots}
        for db, slot in dbs.items():
            log = ToolLog(tool_runs(slot.tool_log), slot.on_disk_after)
            found += asyncio.run(
                with_store(db, lambda s, log=log: check_invariants(s, tool_log=log))
            )
        for slot in self.slots:
            if slot.log.exists() and UNEXPECTED in slot.log.read_text():
                self._fail(f"server {slot.index}'s runtime raised unexpectedly (see {slot.log})")
        return found

    def _plant(self) -> None:
        """Test-only: make one settled row disagree with its settlement record."""
        path = self.slots[0].db.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute(
                "UPDATE submissions SET outcome = 'failed' WHERE id ="
                " (SELECT id FROM submissions WHERE outcome = 'completed' LIMIT 1)"
            )

    def _report(self, violations: list[Violation], elapsed: float) -> int:
        rows, records = [], {}
        for db in {s.db for s in self.slots}:
            got = asyncio.run(with_store(db, reached))
            rows += got[0]
            records.update(got[1])
        outcomes = Counter(reached_outcome(r) for r in rows)
        print("outcomes reached:", ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items())))
        print("recovery situations:", ", ".join(f"{k}={v}" for k, v in situations(rows, records)))
        missing = [o for o in OUTCOMES_REQUIRED if not outcomes.get(o)]
        if missing:
            text = f"outcomes never reached: {', '.join(missing)}"
            if self.total_kills() >= MIN_KILLS_FOR_COVERAGE:
                self._fail(text)
            else:
                print(f"note: {text}")
        ready = [s for slot in self.slots for s in slot.ready_s]
        if ready:
            ready.sort()
            print(
                f"restart to ready: median {ready[len(ready) // 2]:.2f} s, worst {ready[-1]:.2f} s"
                f" over {len(ready)} starts"
            )
        print(
            f"kills by kind: {dict(self.kills)}; planned points that never fired:"
            f" {self.missed.total()}"
            f" {dict(self.missed.most_common(8))}"
        )
        if self.refused:
            print(f"starts refused while the database restarted: {self.refused}")
        print(f"total time: {elapsed:.0f} s; workdir {self.workdir}")
        for v in violations[:50]:
            print(f"VIOLATION: {v}")
        for f in self.failures:
            print(f"check failed: {f}")
        print(
            f"kills: {self.total_kills()}, submissions: {len(rows)}, violations: {len(violations)}",
            flush=True,
        )
        return 1 if violations or self.failures else 0


def reached_outcome(row: Any) -> str:
    error = row.error if isinstance(row.error, dict) else {}
    kind = error.get("type")
    return f"{row.outcome}:{kind}" if row.outcome == "failed" and kind else str(row.outcome)


async def final_round(load: Load, urls: list[str]) -> list[str]:
    """Wait until every conversation is at rest, then send each one new message that must
    complete."""
    problems: list[str] = []
    clients = [hearth.AsyncClient(url, timeout=30.0) for url in urls]
    try:
        end = time.monotonic() + 180
        for conv in load.conversations:
            handle = clients[conv.server].conversation(conv.agent, conv.id)
            if conv.id in load.owes_abort:  # the load stopped between a stall and its abort
                try:
                    await handle.abort()
                except hearth.errors.ConversationNotFound:
                    pass
            while True:
                try:
                    snap = await handle.snapshot()
                except hearth.errors.ConversationNotFound:
                    break  # it never admitted anything
                busy = [s for s in snap["submissions"] if s.get("outcome") is None]
                if not busy:
                    break
                if time.monotonic() > end:
                    problems.append(f"{conv.agent}/{conv.id} never came to rest: {busy[:3]}")
                    break
                await asyncio.sleep(0.5)

        async def last_message(conv: Any) -> None:
            handle = clients[conv.server].conversation(conv.agent, conv.id)
            try:
                receipt = await handle.send(f"plain final-{conv.id}", idempotency_key="final")
                await handle.read(receipt, timeout=120.0)
            except Exception as exc:
                problems.append(f"{conv.agent}/{conv.id} did not complete a new message: {exc!r}")

        for conv in load.conversations:  # one at a time: a short deadline must hold
            await last_message(conv)
    finally:
        for client in clients:
            await client.aclose()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hearth.testing.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Not 0: each server is killed once before the count is first looked at.
    parser.add_argument(
        "--kills", type=count_from_1, default=1000, help="SIGKILLs to deliver (from 1)"
    )
    parser.add_argument("--seed", type=int, default=1, help="fixes the plan")
    parser.add_argument(
        "--servers", type=count_from_1, default=3, help="hearth serve processes at once (from 1)"
    )
    parser.add_argument(
        "--conversations", type=count_from_1, default=18, help="conversations in all (from 1)"
    )
    parser.add_argument(
        "--pg", type=postgres_url, help="one PostgreSQL database for all servers (postgresql://…)"
    )
    parser.add_argument(
        "--pg-restart-cmd", help="a shell command that restarts the PostgreSQL server, run once"
    )
    parser.add_argument("--workdir", help="where databases and logs go (default: a temp dir)")
    parser.add_argument("--plant-fault", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plant_fault and args.pg:
        parser.error("--plant-fault works on SQLite only")
    if args.pg_restart_cmd and not args.pg:
        parser.error("--pg-restart-cmd goes with --pg")
    os.environ.pop("HEARTH_CRASH_AT", None)
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows as it happens
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
