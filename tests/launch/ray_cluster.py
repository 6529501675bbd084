"""A Ray cluster a test starts on loopback and stops: `ray start --head` (and `ray start --address` for a second
simulated node), token auth off (RAY_AUTH_MODE=disabled, for these processes and the drivers the tests run).

Each `ray start --block` runs in its own session, so stopping it ends exactly the Ray processes it started (its
process group), never another cluster's: the equivalent of `ray stop` scoped to this cluster.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

RAY = [sys.executable, "-m", "ray.scripts.scripts"]   # the `ray` CLI of this interpreter
START_S = 90.0   # `ray start` takes 3-10 s on this machine; a loaded one is slower


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env() -> dict:
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


class LocalCluster:
    """A head node (and optional worker nodes) on 127.0.0.1; `address` is what drivers attach to."""

    def __init__(self):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        self.nodes: list[subprocess.Popen] = []

    def start_head(self, num_cpus: int, resources: str | None = None) -> None:
        self._start(["--head", f"--port={self.port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                     f"--temp-dir={self.temp_dir}"], num_cpus, resources)

    def add_node(self, num_cpus: int, resources: str | None = None) -> None:
        self._start([f"--address={self.address}", "--node-ip-address=127.0.0.1"], num_cpus, resources)

    def _start(self, flags: list[str], num_cpus: int, resources: str | None) -> None:
        argv = [*RAY, "start", "--block", "--disable-usage-stats", f"--num-cpus={num_cpus}", *flags]
        if resources:
            argv.append(f"--resources={resources}")
        self.nodes.append(subprocess.Popen(argv, env=ray_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))

    def wait_for_nodes(self, count: int) -> None:
        """Until `count` nodes are alive in the cluster (asked from a fresh process, as a driver would)."""
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR'); "
                 "print(sum(n['Alive'] for n in ray.nodes()))")
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.nodes):
                raise RuntimeError("a `ray start` exited early")
            out = subprocess.run([sys.executable, "-c", probe, self.address], env=ray_env(), capture_output=True,
                                 text=True, timeout=START_S)
            if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout.strip()) >= count:
                return
            time.sleep(1.0)
        raise RuntimeError(f"the Ray cluster at {self.address} did not have {count} nodes within {START_S:g} s")

    def pids(self) -> set[int]:
        """The live processes of this cluster: members of its `ray start` process groups."""
        groups = {p.pid for p in self.nodes}
        found = set()
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) in groups and fields[0] not in ("Z", "X"):
                found.add(pid)
        return found

    def stop(self) -> None:
        """`ray stop` for this cluster only: SIGTERM its groups (worker nodes first), SIGKILL what is left."""
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for p in reversed(self.nodes):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            for p in self.nodes:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            if not self.pids():
                break
        subprocess.run(["rm", "-rf", self.temp_dir], timeout=30)
