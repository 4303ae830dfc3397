"""Fixtures of the workspace tests. The sandbox tests need bubblewrap (``bwrap``): in CI
(``CI=true``) a missing one fails the run; elsewhere those tests skip, saying why."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture
def bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        reason = "bubblewrap (bwrap) is not installed (apt-get install -y bubblewrap)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI needs it: ./run installs Debian's bubblewrap")
        pytest.skip(reason)
    return path
