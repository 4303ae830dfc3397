"""Fixtures for the fault tests (see ``faultkit``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from faultkit import APPS, missing


@pytest.fixture(scope="session")
def eio_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tests/apps/eioshim.c`` compiled into a shared object."""
    gcc = shutil.which("gcc")
    if gcc is None:
        missing("gcc is not installed")
    out = tmp_path_factory.mktemp("shim") / "eioshim.so"
    done = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(APPS / "eioshim.c"), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out
