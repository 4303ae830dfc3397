"""Fixtures shared by every test folder: a throwaway PostgreSQL cluster for the session.

In CI (``CI=true``) a missing PostgreSQL server fails the run; elsewhere the tests that need it
skip, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pgcluster import Cluster, server_bindir


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI needs it: .ci/run installs Debian's postgresql)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    bindir = server_bindir()
    if bindir is None:
        _missing("no PostgreSQL server is installed (apt-get install -y postgresql)")
        raise AssertionError("unreachable")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _missing("psycopg is not installed: pip install -e '.[postgres]'")
    cluster = Cluster(bindir)
    try:
        yield cluster
    finally:
        cluster.destroy()
