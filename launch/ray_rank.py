"""One rank of a `--backend ray` job, inside its Ray actor: the rank process, its output, its files, its end.

The actor (`RankHost`, made a Ray actor by `ray_backend`) starts the same rank process the local backend starts
(`python -m pypto_rt.launch.rank_main prog args`, in its own session, with the same environment contract), so the
program, its error record, SIGUSR1 stack dumps and shared-memory segments behave identically. The driver polls
it (`poll`), which hands over the output read since the last poll; every call returns at once, so the driver
decides all waits and their deadlines.

Invariants: the rank process dies with the actor (PR_SET_PDEATHSIG: a killed actor or node leaves no rank behind);
`cleanup` leaves no process of the rank's group and no segment of this node's prefix (the actor's node owns
them), and removes the actor's folder. Imports no ray and no torch at module level (the relay needs neither).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from pypto_rt.launch import contract, files
from pypto_rt.launch.job_segments import remove_segments
from pypto_rt.launch.report import read_record
from pypto_rt.launch.supervisor import STACK_S, STACK_SIGNAL, _catches, _group_alive, _killpg, _nonempty

_PR_SET_PDEATHSIG = 1
_LOOPBACK = "127.0.0.1"


def _die_with_parent() -> None:   # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class RankHost:
    """The actor of global rank `rank`: starts its process once, reports its output and end, ends it on request."""

    def __init__(self, rank: int):
        self.rank = rank
        self.folder = tempfile.mkdtemp(prefix=f"pypto-ray-rank{rank}-")
        self.error_file = os.path.join(self.folder, f"rank{rank}.error.json")
        self.stack_file = os.path.join(self.folder, f"rank{rank}.stack.txt")
        self.proc: subprocess.Popen | None = None
        self.ended_at: float | None = None
        self._relay = None
        self._lock = threading.Lock()
        self._out = {"stdout": bytearray(), "stderr": bytearray()}
        self._readers: list[threading.Thread] = []

    def where(self) -> dict:
        """This actor's node (Ray's node id tells simulated nodes on one host apart; the IP cannot) and pid."""
        import ray
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def start(self, argv: list[str], contract_env: dict, passed_env: dict, cwd: str, gateway: tuple | None,
              secret: str) -> int:
        """Start the rank: `argv` after the interpreter, `contract_env` the `contract.rank_env` keywords but the
        files and port (this node's), `passed_env` the driver's variables to pass on. `gateway` (addr, port): the
        store is on another node, reached through a relay this actor runs. Returns the rank's pid."""
        port = contract_env.pop("master_port")
        if gateway is not None:
            from pypto_rt.launch.gateway import relay
            self._relay = relay(tuple(gateway), secret)
            port = self._relay.port
        # (this actor's OMP_NUM_THREADS is Ray's default, its bundle's CPUs, and a job-owned Ray instance inherits
        # the driver's environment with the counts a launcher chose for it: the rank gets the user's, passed from
        # the driver, or its node's share, contract.rank_env)
        chosen = {contract.OMP_THREADS, contract.THREADS_SET, *contract.launcher_threads(os.environ)}
        own = {k: v for k, v in os.environ.items() if k not in chosen}
        env = contract.rank_env({**own, **passed_env}, master_port=port, secret=secret,
                                error_file=self.error_file, stack_file=self.stack_file, **contract_env)
        self.proc = subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd if os.path.isdir(cwd) else None,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        for kind, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            reader = threading.Thread(target=self._read, args=(kind, pipe), daemon=True)
            reader.start()
            self._readers.append(reader)
        threading.Thread(target=self._reap, daemon=True).start()
        return self.proc.pid

    def _read(self, kind: str, pipe) -> None:
        while data := pipe.read1(65536):
            with self._lock:
                self._out[kind] += data
        pipe.close()

    def _reap(self) -> None:
        self.proc.wait()
        self.ended_at = time.time()

    def poll(self) -> dict:
        """Output since the last poll, and the rank's end: returncode (None while it runs), when, and whether
        every byte of its output has been handed over (`drained`)."""
        with self._lock:
            out = {kind: bytes(buf) for kind, buf in self._out.items()}
            for buf in self._out.values():
                buf.clear()
        ended = self.ended_at is not None
        drained = ended and not any(r.is_alive() for r in self._readers)
        return {**out, "returncode": self.proc.returncode if ended else None, "ended_at": self.ended_at,
                "drained": drained}

    def signal(self, sig: int) -> bool:
        """Send `sig` to the rank's process group, unless it has ended; True when sent."""
        if self.ended_at is not None or self.proc.poll() is not None:
            return False
        _killpg(self.proc.pid, sig)
        return True

    def dump_stacks(self) -> None:
        """Ask the running rank for its stacks (rank_main's faulthandler) and wait up to STACK_S for them."""
        if self.proc.poll() is not None or not _catches(self.proc.pid, STACK_SIGNAL):
            return
        os.kill(self.proc.pid, STACK_SIGNAL)
        deadline = time.monotonic() + STACK_S
        while time.monotonic() < deadline and self.proc.poll() is None and not _nonempty(self.stack_file):
            time.sleep(0.02)
        time.sleep(0.02)   # a dump just begun gets a moment to finish

    def outcome(self, extra: tuple[str, ...] = ()) -> dict:
        """The rank's error record, stacks, whether its group outlived it, and the bytes of `extra` files of
        its folder (e.g. a run_function result)."""
        brought = {}
        for name in extra:
            path = os.path.join(self.folder, name)
            try:
                with open(path, "rb") as f:
                    brought[name] = f.read()
            except OSError:
                pass
        try:
            stack = files.read_own(self.stack_file)
        except OSError:
            stack = ""
        left = self.proc is not None and _group_alive(self.proc.pid)
        return {"record": read_record(self.error_file), "stack": stack, "left_processes": left, "files": brought}

    def cleanup(self, shm_prefix: str) -> list[str]:
        """End whatever is left of the rank's group, remove this node's segments of the job and this actor's
        folder, stop the relay; returns the segment names removed."""
        if self.proc is not None:
            _killpg(self.proc.pid, signal.SIGKILL)
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        removed = remove_segments(shm_prefix)
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        shutil.rmtree(self.folder, ignore_errors=True)
        return removed
