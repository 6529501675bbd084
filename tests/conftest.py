"""Shared fixtures: run files through `pypto-run` in a subprocess."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# compiled programs of the suite (and of the pypto-run subprocesses it starts) go to a scratch disk cache
_CACHE = tempfile.mkdtemp(prefix="pypto-rt-test-cache-")
os.environ["PYPTO_CACHE_DIR"] = _CACHE
# the compiled tier (PYPTO_TIER) costs seconds per compile: off unless a test asks (or the environment sets it)
os.environ.setdefault("PYPTO_TIER", "off")


@pytest.fixture(scope="session", autouse=True)
def _scratch_disk_cache():
    yield
    shutil.rmtree(_CACHE, ignore_errors=True)


def default_signals() -> None:
    """A `preexec_fn`: the child starts with SIGINT and SIGHUP at their defaults, as a user's shell starts it (a
    suite run as a background job starts with them ignored, and children inherit that)."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def run_pypto(path: str, *args: str, env: dict | None = None, cwd: str | None = None, timeout: int = 300):
    """`pypto-run path args...` in a fresh interpreter; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "pypto_rt.pypto_run", path, *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=cwd)


@pytest.fixture
def pypto_run():
    return run_pypto
