"""Kill a real process at every kill point each scenario reaches, and check what it left.

Usage::

    python -m hearth.testing.enumerate [--scenario NAME ...] [--max-occurrence K] [--short]
                                       [--jobs J] [--point NAME[#N] ...]

For each scenario (``hearth.testing.scenarios``), a clean traced run on a fresh SQLite file tells
which points it reaches and how often (the fewer of two runs, since a few counts depend on
timing). Then each case — a (point, occurrence ≤ K) — gets a fresh database: the scenario runs
with ``HEARTH_CRASH_AT=point#occurrence``, and the case fails unless the kill fired, the restarted
app settles everything, the invariant checker (with the tools' own log) finds nothing, and one more
message to the same conversation completes. ``--short`` runs each distinct point once, at its first
occurrence, in the first scenario that reaches it. ``--point`` runs just the named cases.

It prints a line per failed case, the counts per scenario, the listed kill points no scenario
reached (unless listed in ``scenarios.UNREACHED``), and last ``cases: N, passed: P, failed: F``;
the exit status is 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hearth.testing._cli import count_from_1, crash_point
from hearth.testing.crash import CrashHarness
from hearth.testing.points import KILL_POINTS
from hearth.testing.scenarios import BY_NAME, SCENARIOS, UNREACHED, Scenario
from hearth.testing.toollog import points_reached, tool_runs

# Short leases and beats, so recovery and renewals happen within a scenario's few seconds.
ENV = {"HEARTH_LEASE_S": "5", "HEARTH_HEARTBEAT_S": "0.2", "HEARTH_SCAN_S": "0.2"}
TIMEOUT = 30.0  # seconds a child may wait for its work to settle
# Points whose count follows the clock (a heartbeat every 0.2 s): a run killed at the last beat a
# clean run saw may end before it, so their occurrences stop one short of the clean count.
CLOCKED = frozenset({"before:store.renew_all", "after:store.renew_all"})


@dataclass(frozen=True)
class Case:
    scenario: Scenario
    point: str
    occurrence: int

    @property
    def crash_at(self) -> str:
        return f"{self.point}#{self.occurrence}"

    def __str__(self) -> str:
        return f"{self.scenario.name} @ {self.crash_at}"


@dataclass(frozen=True)
class Outcome:
    case: Case
    failure: str | None  # None: passed
    seconds: float


class CaseFailed(Exception):
    """A case's check did not hold."""


def play(
    scenario: Scenario, directory: Path, crash_at: str | None, *, check: bool = True
) -> Counter[str]:
    """Play ``scenario`` on a fresh database in ``directory``, killed at ``crash_at`` (or not),
    then (with ``check``) recover, check, and send the follow-up; return the points the
    scenario's run reached."""
    log, trace = directory / "ran.log", directory / "points.log"
    env = {**ENV, "HEARTH_TEST_LOG": str(log), "HEARTH_TRACE_POINTS": str(trace)}
    harness = CrashHarness(scenario.app, db=directory / "hearth.db", env=env)
    for prelude in scenario.prelude:
        before = harness.run(dispatch=prelude.dispatch, crash_at=prelude.crash_at, timeout=TIMEOUT)
        if prelude.crash_at is not None and not before.killed:
            raise CaseFailed(f"the prelude's kill at {prelude.crash_at} never fired")
    measured = harness.runs
    first = harness.run(
        dispatch=scenario.dispatch, mid_tool=scenario.mid_tool, crash_at=crash_at, timeout=TIMEOUT
    )
    if crash_at is not None and not first.killed:
        raise CaseFailed("the planned kill never fired")
    if not check:
        return points_reached(trace, measured)
    harness.run_until_settled(timeout=TIMEOUT)
    harness.assert_invariants(tool_runs(log))
    followup = harness.run(dispatch=[scenario.followup], timeout=TIMEOUT)
    if not followup.ok or len(followup.receipts) != 1:
        raise CaseFailed("the follow-up message was not admitted")
    agent, id, _ = scenario.followup
    wanted = followup.receipts[0]["submission_id"]
    (sub,) = [s for s in harness.submissions(f"{agent}/{id}") if s.id == wanted]
    if sub.outcome != "completed":
        raise CaseFailed(f"the follow-up ended {sub.outcome}: {sub.error}")
    harness.assert_invariants(tool_runs(log))
    return points_reached(trace, measured)


def run_case(case: Case) -> Outcome:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hearth-enum-") as tmp:
        try:
            play(case.scenario, Path(tmp), case.crash_at)
            failure = None
        except Exception as exc:  # every way a case can go wrong is its failure, reported
            failure = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
    return Outcome(case, failure, time.monotonic() - start)


def learn(scenario: Scenario, runs: int = 2, *, check: bool = True) -> Counter[str]:
    """The points a clean run of ``scenario`` reaches, with the fewest count of ``runs`` runs
    (with ``check``, each run is also recovered and checked like a case)."""
    counts: Counter[str] | None = None
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="hearth-enum-") as tmp:
            try:
                seen = play(scenario, Path(tmp), None, check=check)
            except Exception as exc:
                raise SystemExit(f"scenario {scenario.name}: its clean run failed: {exc}") from exc
        counts = seen if counts is None else counts & seen
    assert counts is not None
    return counts


def plan(reached: dict[str, Counter[str]], *, max_occurrence: int, short: bool) -> list[Case]:
    cases: list[Case] = []
    covered: set[str] = set()
    for name, counts in reached.items():
        for point in sorted(counts):
            if short:
                if point not in covered:
                    cases.append(Case(BY_NAME[name], point, 1))
                    covered.add(point)
                continue
            last = counts[point] - 1 if point in CLOCKED else counts[point]
            for n in range(1, min(max_occurrence, max(last, 1)) + 1):
                cases.append(Case(BY_NAME[name], point, n))
    return cases


def named_cases(scenarios: Sequence[Scenario], points: Iterable[str]) -> list[Case]:
    """A case per scenario for each point (checked by ``check_crash_at``); the occurrence is
    that of the last stage of a chain (``a#2>b#3`` is ``a#2>b`` at 3; no ``#N``: 1)."""
    cases: list[Case] = []
    for spec in points:
        earlier, arrow, last = spec.rpartition(">")
        name, _, n = last.partition("#")
        point = f"{earlier}{arrow}{name}"
        cases.extend(Case(s, point, int(n or 1)) for s in scenarios)
    return cases


def run_all(cases: Sequence[Case], jobs: int, report: Callable[[Outcome], None]) -> list[Outcome]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outcomes = []
        for outcome in pool.map(run_case, cases):
            report(outcome)
            outcomes.append(outcome)
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hearth.testing.enumerate")
    parser.add_argument("--scenario", action="append", choices=sorted(BY_NAME), default=[])
    parser.add_argument("--max-occurrence", type=count_from_1, default=3, metavar="K")
    parser.add_argument("--short", action="store_true", help="each distinct point once")
    parser.add_argument("--jobs", type=count_from_1, default=1, metavar="J")
    parser.add_argument(
        "--point", action="append", type=crash_point, default=[], help="only this NAME[#N]"
    )
    args = parser.parse_args(argv)
    scenarios = [BY_NAME[n] for n in args.scenario] or list(SCENARIOS)
    started = time.monotonic()

    unreached: list[str] = []
    if args.point:
        cases = named_cases(scenarios, args.point)
    else:
        # The short form needs only which points are reached; its cases check everything.
        runs = 1 if args.short else 2
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            learned = pool.map(lambda s: learn(s, runs, check=not args.short), scenarios)
            reached = {s.name: counts for s, counts in zip(scenarios, learned, strict=True)}
        for name, counts in reached.items():
            print(f"scenario {name}: reaches {len(counts)} points", flush=True)
        cases = plan(reached, max_occurrence=args.max_occurrence, short=args.short)
        if len(scenarios) == len(SCENARIOS):
            seen = set().union(*reached.values())
            unreached = sorted(set(KILL_POINTS) - seen - set(UNREACHED))
            for point in sorted(set(KILL_POINTS) - seen):
                why = UNREACHED.get(point, "NOT LISTED as unreachable")
                print(f"unreached: {point} ({why})", flush=True)

    def report(outcome: Outcome) -> None:
        if outcome.failure is not None:
            print(f"FAILED {outcome.case}: {outcome.failure}", flush=True)

    outcomes = run_all(cases, args.jobs, report)
    failed = [o for o in outcomes if o.failure is not None]
    for scenario in scenarios:
        mine = [o for o in outcomes if o.case.scenario is scenario]
        bad = sum(o.failure is not None for o in mine)
        print(
            f"scenario {scenario.name}: {len(mine)} cases, {len(mine) - bad} passed, {bad} failed"
        )
    print(f"kill points reached by no scenario and not listed: {len(unreached)}")
    print(f"time: {time.monotonic() - started:.0f}s with {args.jobs} job(s)")
    passed = len(outcomes) - len(failed)
    print(f"cases: {len(outcomes)}, passed: {passed}, failed: {len(failed)}")
    return 1 if failed or unreached else 0


if __name__ == "__main__":
    sys.exit(main())
