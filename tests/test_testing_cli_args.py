"""The test tools' commands (``python -m hearth.testing.enumerate`` / ``.soak``) check their
arguments before any work: a bad value ends in one error line and exit status 2, no traceback.

Each command runs in a subprocess whose work is stubbed out (``learn`` and ``run_all``, or
``Soak``): a value that gets past the checks ends in ``WORK STARTED`` instead of running a soak
or an enumeration, so these tests stay fast even when a check is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hearth.testing.enumerate import named_cases
from hearth.testing.scenarios import SCENARIOS

STUBBED = """
import sys
import hearth.testing.{module} as tool

def started(*args, **kwargs):
    raise SystemExit("WORK STARTED")

for name in {stubs!r}:
    setattr(tool, name, started)
sys.exit(tool.main(sys.argv[1:]))
"""
STUBS = {"enumerate": ("learn", "run_all"), "soak": ("Soak",)}
PROG = {name: f"python -m hearth.testing.{name}" for name in STUBS}


def run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = STUBBED.format(module=module, stubs=STUBS[module])
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def refused(module: str, *args: str) -> str:
    """The one error line ``module`` ends with on ``args``, after checking it started no work."""
    done = run(module, *args)
    assert "WORK STARTED" not in done.stderr, f"{args} were taken: the work started"
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("usage: "), done.stderr
    last = lines[-1]
    prefix = f"{PROG[module]}: error: "
    assert last.startswith(prefix), done.stderr
    return last.removeprefix(prefix)


def accepted(module: str, *args: str) -> None:
    done = run(module, *args)
    assert done.stderr.strip().splitlines()[-1:] == ["WORK STARTED"], done.stderr
    assert done.returncode == 1


# --- enumerate --point ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("point", "said"),
    [
        ("tool:pause#x", "argument --point: 'tool:pause#x': #x must be a whole number from 1"),
        ("tool:pause#0", "argument --point: 'tool:pause#0': #0 must be a whole number from 1"),
        ("tool:pause#", "argument --point: 'tool:pause#': # must be a whole number from 1"),
        (
            "no-such-point#2",
            "argument --point: 'no-such-point#2': no point is named 'no-such-point' (see"
            " hearth.testing.KILL_POINTS and KILL_POINT_PATTERNS)",
        ),
    ],
)
def test_enumerate_refuses_a_bad_point(point: str, said: str) -> None:
    assert refused("enumerate", "--scenario", "abort", "--point", point) == said


@pytest.mark.parametrize(
    "point", ["tool:pause", "tool:pause#2", "after:store.admit#2>store:commit-begin#3"]
)
def test_enumerate_takes_a_good_point(point: str) -> None:
    accepted("enumerate", "--scenario", "abort", "--point", point)


def test_a_named_case_keeps_every_stage_of_a_chained_point() -> None:
    scenario = SCENARIOS[0]
    cases = named_cases([scenario], ["after:store.admit#2>store:commit-begin", "model:start#3"])
    assert [c.crash_at for c in cases] == [
        "after:store.admit#2>store:commit-begin#1",
        "model:start#3",
    ]


# --- enumerate --jobs, --max-occurrence ----------------------------------------------------------
@pytest.mark.parametrize("option", ["--jobs", "--max-occurrence"])
@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5"])
def test_enumerate_refuses_a_count_below_one(option: str, value: str) -> None:
    said = refused("enumerate", "--short", option, value)
    assert said == f"argument {option}: must be a whole number from 1, not {value!r}"


@pytest.mark.parametrize("option", ["--jobs", "--max-occurrence"])
def test_enumerate_takes_a_count_of_one(option: str) -> None:
    accepted("enumerate", "--short", option, "1")


# --- soak --kills -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_soak_refuses_kills_below_one(value: str) -> None:
    said = refused("soak", "--kills", value)
    assert said == f"argument --kills: must be a whole number from 1, not {value!r}"


def test_soak_takes_one_kill() -> None:
    accepted("soak", "--kills", "1")


# --- soak --pg ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("notaurl", "'notaurl' is not a PostgreSQL URL (postgresql://… or postgres://…)"),
        ("", "'' is not a PostgreSQL URL (postgresql://… or postgres://…)"),
        (
            "sqlite:///x.db",
            "'sqlite:///x.db' is not a PostgreSQL URL (postgresql://… or postgres://…)",
        ),
        (  # the password is not shown
            "mysql://u:hunter2@h/db",
            "'mysql://u:***@h/db' is not a PostgreSQL URL (postgresql://… or postgres://…)",
        ),
        (
            "postgresql://u:hunt@r2@h/db",
            "bad PostgreSQL URL postgresql://u:***@h/db: an @ in the user name or password must"
            " be written %40",
        ),
    ],
)
def test_soak_refuses_a_pg_that_is_not_a_postgresql_url(url: str, said: str) -> None:
    assert refused("soak", "--pg", url, "--kills", "1") == f"argument --pg: {said}"


@pytest.mark.parametrize(
    "url",
    ["postgresql://u@localhost/db", "postgres://u:pw@h:5432/db", "postgresql:///db?host=/tmp"],
)
def test_soak_takes_a_postgresql_url(url: str) -> None:
    accepted("soak", "--pg", url, "--kills", "1")
