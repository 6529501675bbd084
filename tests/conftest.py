"""Shared fixtures: run files through `pypto-run` in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_pypto(path: str, *args: str, env: dict | None = None, cwd: str | None = None, timeout: int = 300):
    """`pypto-run path args...` in a fresh interpreter; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "pypto_rt.pypto_run", path, *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=cwd)


@pytest.fixture
def pypto_run():
    return run_pypto
