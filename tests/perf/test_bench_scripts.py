"""The benchmark scripts that need nothing but this checkout still run and print their table.

Figures are never judged here (timing on a shared machine is no test of speed): each script is
run as a user runs it, with tiny counts, and must finish and print every row it promises.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_script(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BENCH,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_step_anatomy_prints_every_layer_against_the_floor() -> None:
    out = run_script(
        "step_anatomy.py", "--steps", "20", "--warmup", "5", "--rounds", "1", "--pause", "0"
    )
    table = out[out.index("layer") :].splitlines()
    layers = [line.split()[0] for line in table[1:-3] if line.strip()]
    assert layers == ["floor", "sql", "json", "ops.append", "store.append", "step.do"]
    assert "1.00x" in table[1]
    assert re.search(r"json ÷ floor, round by round: \d+\.\d\dx \(SPEC", table[-3])
    assert re.search(r"step\.do's COMMIT statement alone: median \d+\.\d{3} ms", table[-2])
    assert re.search(r"before its COMMIT: \d+ µs after a synced commit .* \d+\.\d\dx", table[-1])


def test_step_overhead_prints_its_percentiles() -> None:
    out = run_script("step_overhead.py", "--steps", "30")
    assert "median" in out and "p99" in out
