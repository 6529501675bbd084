"""The environment contract between pypto-launch and each rank it starts (names only; no logic but `rank_env`).

Every rank process gets, on top of the launcher's own environment:

====================  ================================================================================
RANK                  global rank, ``node_rank * nproc + local_rank``
LOCAL_RANK            rank on this host, ``0 .. nproc-1``
WORLD_SIZE            ``nnodes * nproc``
LOCAL_WORLD_SIZE      ``nproc``
MASTER_ADDR           ``127.0.0.1``: the rendezvous store (node 0's launcher hosts it) or, on other nodes, the
                      launcher's relay to it; the store is reachable from other hosts only through its gateway
MASTER_PORT           its port: the port the store (or relay) actually bound, so there is no free-port race
PYPTO_LAUNCHED        ``1``
PYPTO_COMM            ``shm`` | ``gloo`` | ``nccl`` | ``hccl``: the communicator the ranks should build
PYPTO_JOB_ID          the job's id (``--job-id``, else random hex)
PYPTO_JOB_SECRET      the job's store secret: every key lives under it, and a rank without it cannot use the
                      store (the launcher's PYPTO_JOB_SECRET, else random); never on a command line
PYPTO_SHM_PREFIX      ``pypto-<job id>``: name every shared-memory segment with it; the launcher owns them
                      and removes every ``/dev/shm/<prefix>+*`` when the job ends, however it ends
PYPTO_RANK_NODES      only with ``--backend ray`` over several nodes: each rank's node index, by rank (``0,0,1,1``);
                      PYPTO_SHM_PREFIX is then ``pypto-<job id>.n<node>``, LOCAL_RANK / LOCAL_WORLD_SIZE count the
                      ranks of the rank's node, and shared-memory windows refuse to span nodes
PYPTO_ERROR_FILE      where the rank writes its error record (JSON, see ``rank_main``) when it fails
PYPTO_STACK_FILE      where the rank writes every thread's stack (``faulthandler``) on SIGUSR1, which the launcher
                      sends the ranks still running when another rank failed, before it ends them
PYPTO_TIMEOUT_S       only with ``--timeout-s``: the ranks' no-progress deadline
====================  ================================================================================

Also set, for code written against torch's launcher: ``TORCHELASTIC_USE_AGENT_STORE=True`` (MASTER_ADDR:PORT is
the launcher's store, so ranks join it as clients, and ``init_process_group(init_method="env://")`` works as it
does under torchrun), and ``PYTHONUNBUFFERED=1`` unless already set, so rank output reaches logs line by line.

Intra-op threads: ``OMP_NUM_THREADS`` (torch's CPU thread count at import, OpenMP's team size) is the host's usable
cores divided by the ranks on it (``LOCAL_WORLD_SIZE``), at least 1, unless already set; the ranks of a host then
share its cores instead of each running a team as large as the host (4 ranks of 2 threads on 2 cores spin-wait
for each other's cores). torchrun sets 1 whenever it starts more than one rank. ``PYPTO_GOLDEN_NUM_THREADS`` (the
count ``pypto_rt.golden`` sets at import) follows ``OMP_NUM_THREADS`` unless already set. An empty value counts as
unset. ``PYPTO_THREADS_SET`` names the ones a launcher set (not the user): a ``--backend ray`` launch from such a
rank (``pypto-launch``, ``run_function``) leaves them behind, so its ranks on other nodes get their node's share, not
this host's (a local launch from a rank keeps them: its ranks share this rank's cores).
"""
from __future__ import annotations

import os

from pypto_rt import knobs

# the variables' names; each is declared (type, doc) in pypto_rt.knobs
RANK = knobs.RANK.env
LOCAL_RANK = knobs.LOCAL_RANK.env
WORLD_SIZE = knobs.WORLD_SIZE.env
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"   # torchrun's; no pypto-rt code reads it
MASTER_ADDR = knobs.MASTER_ADDR.env
MASTER_PORT = knobs.MASTER_PORT.env
LAUNCHED = knobs.LAUNCHED.env
COMM = knobs.COMM.env
JOB_ID = knobs.JOB_ID.env
JOB_SECRET = knobs.JOB_SECRET.env
SHM_PREFIX = knobs.SHM_PREFIX.env
ERROR_FILE = knobs.ERROR_FILE.env
STACK_FILE = knobs.STACK_FILE.env
TIMEOUT_S = knobs.TIMEOUT_S.env
RANK_NODES = knobs.RANK_NODES.env
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
OMP_THREADS = "OMP_NUM_THREADS"
GOLDEN_THREADS = knobs.GOLDEN_NUM_THREADS.env
THREADS_SET = knobs.THREADS_SET.env

SHM_DIR = "/dev/shm"
RESULT_FILE = "rank{rank}.result.pkl"   # a run_function rank's return value, beside its error file


def shm_prefix(job_id: str, node: int | None = None) -> str:
    """Name prefix of the job's shared-memory segments (a file name under /dev/shm, no slash); with `node`, that
    node's own namespace in a job over several Ray nodes (`pypto-<job>.n<node>`: no clean-up of another node's)."""
    return f"pypto-{job_id}" if node is None else f"pypto-{job_id}.n{node}"


def rank_env(base: dict[str, str], *, rank: int, local_rank: int, world_size: int, local_world_size: int,
             master_addr: str, master_port: int, comm: str, job_id: str, secret: str, error_file: str,
             stack_file: str, timeout_s: float | None, node: int | None = None,
             rank_nodes: list[int] | None = None) -> dict[str, str]:
    """`base` plus the contract variables for one rank; `node` and `rank_nodes` only for a job over several
    nodes (the node's own shared-memory namespace, and PYPTO_RANK_NODES)."""
    env = dict(base)
    env.update({
        RANK: str(rank), LOCAL_RANK: str(local_rank), WORLD_SIZE: str(world_size),
        LOCAL_WORLD_SIZE: str(local_world_size), MASTER_ADDR: master_addr, MASTER_PORT: str(master_port),
        LAUNCHED: "1", COMM: comm, JOB_ID: job_id, SHM_PREFIX: shm_prefix(job_id, node), ERROR_FILE: error_file,
        JOB_SECRET: secret, STACK_FILE: stack_file, AGENT_STORE: "True",
    })
    if timeout_s is not None:
        env[TIMEOUT_S] = repr(timeout_s)
    if rank_nodes is not None:
        env[RANK_NODES] = ",".join(map(str, rank_nodes))
    env.setdefault("PYTHONUNBUFFERED", "1")
    chosen = launcher_threads(env)   # (an outer launch's, kept)
    if not env.get(OMP_THREADS):
        env[OMP_THREADS] = str(intra_op_threads(local_world_size))
        chosen.append(OMP_THREADS)
    if not env.get(GOLDEN_THREADS):
        env[GOLDEN_THREADS] = env[OMP_THREADS]
        chosen.append(GOLDEN_THREADS)
    if chosen:
        env[THREADS_SET] = ",".join(dict.fromkeys(chosen))
    return env


def launcher_threads(env) -> list[str]:
    """The thread-count variables a launcher chose in `env` (PYPTO_THREADS_SET names them), in order."""
    return [name for name in env.get(THREADS_SET, "").split(",") if name]


def intra_op_threads(local_world_size: int, cores: int | None = None) -> int:
    """Each rank's share of this host's usable cores (`cores`: the launcher's CPU affinity), at least 1."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size))
