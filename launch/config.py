"""`LaunchConfig`: everything one pypto-launch job needs, already validated (the CLI builds it, nothing else reads
argparse objects)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

COMMS = ("shm", "gloo", "nccl", "hccl")
BACKENDS = ("local", "ray")
PLACEMENTS = ("pack", "spread")   # --placement: Ray placement-group strategies PACK / SPREAD
RAY_INSTALL = "pip install 'pypto-rt[ray]'"
JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")   # a job id names /dev/shm segments and log lines: no other characters


def missing_comm_library(comm: str) -> str | None:
    """What this machine lacks for an accelerator communicator (nccl, hccl), or None; checked before any rank
    starts. (torch is imported only for those.)"""
    if comm not in ("nccl", "hccl"):
        return None
    from pypto_rt.collective.torch_backend import missing_library
    return missing_library(comm)


@dataclass(frozen=True)
class LaunchConfig:
    """One job: `nproc` ranks on this host (node `node_rank` of `nnodes`) running `target`.

    Attributes:
        target: the program: a file path, or a module name when `module` is True (`-m`).
        args: the program's own arguments.
        module: run `target` as `python -m target` would.
        nproc: ranks on this host.
        nnodes: hosts in the job; each runs one launcher.
        node_rank: this host's index; node 0 hosts the rendezvous store.
        master_addr: host of the store.
        master_port: its port; None (node 0 only) lets the store pick a free one.
        log_dir: per-rank stdout/stderr/error files go here; None: rank output goes to the terminal.
        tee: with `log_dir`, also echo rank output to the terminal.
        comm: communicator the ranks build (exported as PYPTO_COMM).
        backend: how ranks are started: "local" (processes of this launcher) or "ray" (one Ray actor per rank).
        address: ray only: the cluster to attach to ("auto", "HOST:PORT"); None starts a Ray instance for the job.
        placement: ray only: "pack" (fill a node first) or "spread" the ranks' bundles over the nodes.
        rank_resources: ray only: each rank's placement-group bundle, e.g. (("CPU", 1.0), ("GPU", 1.0)).
        timeout_s: the ranks' no-progress deadline (exported as PYPTO_TIMEOUT_S); None: the ranks' default.
        job_id: names the job's shared memory (`pypto-<job_id>*`) and log lines.
        secret: the job's store secret (PYPTO_JOB_SECRET: every key lives under it); never printed.
    """
    target: str
    args: tuple[str, ...] = ()
    module: bool = False
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    log_dir: str | None = None
    tee: bool = False
    comm: str = "shm"
    backend: str = "local"
    timeout_s: float | None = None
    job_id: str = ""
    secret: str = field(default="", repr=False)
    address: str | None = None
    placement: str = "pack"
    rank_resources: tuple[tuple[str, float], ...] = (("CPU", 1.0),)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc + local_rank


def ray_problem(nnodes: int) -> str | None:
    """Why `--backend ray` cannot run here (Ray missing, or --nnodes given), in one sentence; or None."""
    import importlib.util
    if importlib.util.find_spec("ray") is None:
        return f"Ray is not installed; install it with {RAY_INSTALL}"
    if nnodes != 1:
        return (f"Ray places the ranks on its nodes itself: drop --nnodes {nnodes} (and --node-rank), give the "
                "job's total ranks as --nproc, and --placement pack|spread")
    return None


def parse_resources(text: str) -> tuple[tuple[str, float], ...]:
    """"CPU=1,GPU=1,node_a=1" -> (("CPU", 1.0), ("GPU", 1.0), ("node_a", 1.0)); ValueError saying what is wrong."""
    pairs = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, sep, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not sep or not name.strip() or not value >= 0:
            raise ValueError(f"{item!r} is not NAME=AMOUNT with AMOUNT >= 0 (e.g. CPU=1,GPU=1)")
        pairs.append((name.strip(), value))
    if not pairs:
        raise ValueError("no resources given (e.g. CPU=1)")
    return tuple(pairs)
