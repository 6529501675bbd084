"""Fixtures for pypto-launch tests: write tiny rank programs (plain Python, no torch unless a test needs it) and
run the launcher in this process (`cli.main`), capturing what it prints."""
from __future__ import annotations

import os
import textwrap
import time

import pytest

from pypto_rt.launch import cli
from tests.launch.job_result import Job


@pytest.fixture(autouse=True)
def _no_launcher_settings_from_outside(monkeypatch):
    """The caller's PYPTO_NPROC etc. must not change what a test launches."""
    for knob in cli._FLAGS.values():
        monkeypatch.delenv(knob.env, raising=False)
    monkeypatch.delenv(cli._TEE_ENV, raising=False)
    monkeypatch.delenv("PYPTO_JOB_SECRET", raising=False)


@pytest.fixture
def program(tmp_path):
    """program(body, name="prog.py") -> path of a file holding the dedented `body`."""
    def write(body: str, name: str = "prog.py") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body).lstrip())
        return str(path)
    return write


@pytest.fixture
def launch(capfd):
    """launch(*argv) -> Job: runs `pypto-launch argv...` in this process."""
    def run(*argv: str) -> Job:
        capfd.readouterr()
        start = time.monotonic()
        rc = cli.main(list(argv))
        seconds = time.monotonic() - start
        captured = capfd.readouterr()
        return Job(rc, captured.out, captured.err, seconds)
    return run


def pid_gone(pid: int) -> bool:
    """True when `pid` no longer runs (gone, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
