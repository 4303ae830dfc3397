"""Counters and latency histograms, rendered in Prometheus' text format by the server."""

from __future__ import annotations

import bisect
import threading
from collections import Counter

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(_BUCKETS) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(_BUCKETS, seconds)] += 1
        self.total += seconds
        self.n += 1

    def render(self, name: str) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        running = 0
        for bound, count in zip(_BUCKETS, self.counts, strict=False):
            running += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum {self.total:.6f}")
        lines.append(f"{name}_count {self.n}")
        return lines


class Metrics:
    """Process-wide numbers about the runtime's work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.admitted = 0
        self.running = 0
        self.recoveries = 0
        self.settled_by_outcome: Counter[str] = Counter()
        self.appends = Histogram()
        self.steps = Histogram()

    def settled(self, outcome: str) -> None:
        with self._lock:
            self.settled_by_outcome[outcome] += 1

    def observe_step(self, seconds: float) -> None:
        with self._lock:
            self.steps.observe(seconds)

    def observe_append(self, seconds: float) -> None:
        with self._lock:
            self.appends.observe(seconds)

    def render(self) -> str:
        with self._lock:
            lines = [
                "# TYPE hearth_submissions_admitted_total counter",
                f"hearth_submissions_admitted_total {self.admitted}",
                "# TYPE hearth_submissions_running gauge",
                f"hearth_submissions_running {self.running}",
                "# TYPE hearth_submissions_settled_total counter",
            ]
            for outcome in ("completed", "failed", "aborted"):
                lines.append(
                    f'hearth_submissions_settled_total{{outcome="{outcome}"}} '
                    f"{self.settled_by_outcome[outcome]}"
                )
            lines += [
                "# TYPE hearth_recoveries_total counter",
                f"hearth_recoveries_total {self.recoveries}",
            ]
            lines += self.appends.render("hearth_append_seconds")
            lines += self.steps.render("hearth_step_seconds")
        return "\n".join(lines) + "\n"
