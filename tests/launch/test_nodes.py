"""A job across hosts (one launcher per node, simulated here on one machine): a failing rank on one node ends
the ranks of every node, and each launcher says why."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

LAUNCH = [sys.executable, "-m", "pypto_rt.launch.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(300)
def test_a_rank_failing_on_one_node_ends_the_other_nodes_ranks(program):
    prog = program('''
        import os, time
        if os.environ["RANK"] == "3":
            raise RuntimeError("rank 3 on node 1 gives up")
        time.sleep(600)
    ''')
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYPTO_")}
    env["PYPTO_JOB_SECRET"] = "a shared secret"
    common = ["--nproc", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "--comm", "gloo"]
    start = time.monotonic()
    node0 = subprocess.Popen(LAUNCH + common + ["--node-rank", "0", prog], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(1.0)   # node 0 hosts the store
    node1 = subprocess.run(LAUNCH + common + ["--node-rank", "1", prog], capture_output=True, text=True, env=env,
                           timeout=240)
    out0, err0 = node0.communicate(timeout=240)
    # not the ranks' 600 s sleep (a loaded 2-core machine took 39 s to start and end the four ranks)
    assert time.monotonic() - start < 200
    assert node1.returncode == 1 and "rank 3 failed first" in node1.stderr and "gives up" in node1.stderr
    assert node0.returncode == 1, err0
    assert "another node failed" in err0 and "node 1: rank 3 failed" in err0
