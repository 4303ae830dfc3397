"""The pgbouncer tests' fixture: in CI (``CI=true``) a missing pgbouncer fails the run;
elsewhere the tests that need it skip, saying why."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from bouncer import PgBouncer, program
from pgcluster import Cluster


@pytest.fixture
def pgbouncer(pg_cluster: Cluster) -> Iterator[Callable[..., PgBouncer]]:
    """``pgbouncer(mode, ignore="")``: a pgbouncer in front of the session's cluster."""
    found = program()
    if found is None:
        reason = "pgbouncer is not installed (apt-get install -y pgbouncer)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (CI needs it: ./run installs Debian's pgbouncer)")
        pytest.skip(reason)
        raise AssertionError("unreachable")
    path: str = found
    started: list[PgBouncer] = []

    def start(mode: str, ignore: str = "") -> PgBouncer:
        started.append(PgBouncer(path, pg_cluster, mode, ignore))
        return started[-1]

    try:
        yield start
    finally:
        for bouncer in started:
            bouncer.stop()
