from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from crashlab import Lab


@pytest.fixture
def labs(tmp_path: Path) -> Iterator[list[Lab]]:
    """Every lab a test makes; after the test, each passes the invariant checker."""
    made: list[Lab] = []
    yield made
    for lab in made:
        lab.assert_invariants()


@pytest.fixture
def make_lab(tmp_path: Path, labs: list[Lab]) -> Callable[[str], Lab]:
    def make(app: str) -> Lab:
        labs.append(Lab(tmp_path, app))
        return labs[-1]

    return make


@pytest.fixture
def lab(make_lab: Callable[[str], Lab]) -> Lab:
    return make_lab("crashapp:app")


@pytest.fixture
def lab_delegating(make_lab: Callable[[str], Lab]) -> Lab:
    return make_lab("delegating:app")
