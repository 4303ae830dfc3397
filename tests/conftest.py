"""Fixtures shared by every test folder: a throwaway PostgreSQL cluster for the session, and
``db_url``, a fresh database on each store in turn.

In CI (``CI=true``) a missing PostgreSQL server fails the run; elsewhere the tests that need it
skip, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database: a SQLite file, or a schema of the session's PostgreSQL cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'h.db'}"
    url: str = request.getfixturevalue("pg_cluster").url()
    return url
