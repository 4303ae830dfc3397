from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from crashlab import Lab


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path)


@pytest.fixture
def make_lab(tmp_path: Path) -> Callable[[str], Lab]:
    return lambda app: Lab(tmp_path, app)


@pytest.fixture
def lab_delegating(tmp_path: Path) -> Lab:
    return Lab(tmp_path, "delegating:app")
