"""Counters and latency histograms, rendered in Prometheus' text format by the server."""

from __future__ import annotations

import bisect
import threading
from collections import Counter

# Appends and steps take milliseconds; attempts and model calls take seconds to minutes.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_SLOW_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = _BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds
        self.n += 1

    def render(self, name: str, help: str) -> list[str]:
        lines = [f"# HELP {name} {help}", f"# TYPE {name} histogram"]
        running = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum {self.total:.6f}")
        lines.append(f"{name}_count {self.n}")
        return lines


class Metrics:
    """Process-wide numbers about the runtime's work.

    Labels take only values from a short fixed list (an outcome): never an id, a name or
    anything else a caller chooses, so the number of series stays bounded.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.admitted = 0
        self.running = 0
        self.recoveries = 0
        self.settled_by_outcome: Counter[str] = Counter()
        self.appends = Histogram()
        self.steps = Histogram()
        self.attempts = Histogram(_SLOW_BUCKETS)
        self.model_calls = Histogram(_SLOW_BUCKETS)

    def settled(self, outcome: str) -> None:
        with self._lock:
            self.settled_by_outcome[outcome] += 1

    def observe_step(self, seconds: float) -> None:
        with self._lock:
            self.steps.observe(seconds)

    def observe_append(self, seconds: float) -> None:
        with self._lock:
            self.appends.observe(seconds)

    def observe_attempt(self, seconds: float) -> None:
        with self._lock:
            self.attempts.observe(seconds)

    def observe_model_call(self, seconds: float) -> None:
        with self._lock:
            self.model_calls.observe(seconds)

    def render(self) -> str:
        with self._lock:
            lines = [
                "# HELP hearth_submissions_admitted_total Submissions admitted by this process.",
                "# TYPE hearth_submissions_admitted_total counter",
                f"hearth_submissions_admitted_total {self.admitted}",
                "# HELP hearth_submissions_running Attempts running in this process now.",
                "# TYPE hearth_submissions_running gauge",
                f"hearth_submissions_running {self.running}",
                "# HELP hearth_submissions_settled_total Submissions settled, by outcome.",
                "# TYPE hearth_submissions_settled_total counter",
            ]
            for outcome in ("completed", "failed", "aborted"):
                lines.append(
                    f'hearth_submissions_settled_total{{outcome="{outcome}"}} '
                    f"{self.settled_by_outcome[outcome]}"
                )
            lines += [
                "# HELP hearth_recoveries_total Attempts after the first (work taken over).",
                "# TYPE hearth_recoveries_total counter",
                f"hearth_recoveries_total {self.recoveries}",
            ]
            lines += self.appends.render(
                "hearth_append_seconds", "Time to append a batch of records to the store."
            )
            lines += self.steps.render(
                "hearth_step_seconds", "Time to run and record one step of a durable tool."
            )
            lines += self.attempts.render(
                "hearth_attempt_seconds", "Time from claiming a submission to letting it go."
            )
            lines += self.model_calls.render(
                "hearth_model_call_seconds", "Time of one streamed model call."
            )
        return "\n".join(lines) + "\n"
