"""Ctrl-C to the launcher (a real `pypto-launch` process) ends every rank and everything the ranks started."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.launch.conftest import pid_gone


@pytest.mark.timeout(90)
def test_sigint_ends_all_ranks_and_their_children_without_a_traceback(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(f"""
        import os, subprocess, time
        child = subprocess.Popen(["sleep", "120"])
        with open(os.path.join({str(pids)!r}, os.environ["RANK"]), "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(120)
    """))
    launcher = subprocess.Popen([sys.executable, "-m", "pypto_rt.launch.cli", "--nproc", "2", str(prog)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(pids)) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.05)
        assert len(os.listdir(pids)) == 2, launcher.stderr.read() if launcher.poll() is not None else "no ranks"
        started = [int(p) for f in pids.iterdir() for p in f.read_text().split()]
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted by SIGINT" in err and "rank 0: killed by the launcher (SIGTERM)" in err
    deadline = time.monotonic() + 5
    while not all(pid_gone(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in started if not pid_gone(p)] == []
