"""One pypto-launch job on this host: host the store (node 0), start the ranks, supervise them, report, clean up.

Ownership: the launcher owns the job's temporary folder, the rendezvous store and every shared-memory segment
named `pypto-<job id>+*`; all are gone when `run_job` returns, however the job ended (a SIGKILLed launcher
excepted). Exit codes: 0 every rank exited 0; 1 a rank failed (or could not start); 128+N the launcher got
signal N (130 for Ctrl-C, 143 for SIGTERM); 2 the job could not be set up (log folder, store port).
The job prints nothing of its own at its end: what the launcher has to say (the failure summary, a setup error)
is the `report` of the `JobResult` it returns, which the CLI prints and a Python caller may.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time

from pypto_rt.launch import contract, files
from pypto_rt.launch.config import LaunchConfig
from pypto_rt.launch.output import TAIL_BYTES
from pypto_rt.launch.job_store import LOOPBACK
from pypto_rt.launch.report import RankResult, first_failure, read_record, summarize
from pypto_rt.launch.job_segments import remove_segments
from pypto_rt.launch.result import JobResult, job_result
from pypto_rt.launch.signals import SignalWatch
from pypto_rt.launch.supervisor import RankProc, RankSpec, Supervisor

# After a failure that carries a wait report, the other ranks are likely stuck in waits whose deadlines are
# about to expire too; their reports complete the cross-rank picture, so they get this long before SIGTERM.
WAIT_SETTLE_S = 2.0


def run_job(cfg: LaunchConfig) -> JobResult:
    """Run the job described by `cfg` to its end; returns its result (the launcher's exit code, each rank's end,
    the report to print)."""
    tmp_dir = job_store = None
    try:
        if cfg.log_dir:
            try:
                os.makedirs(cfg.log_dir, mode=0o755, exist_ok=True)
                files.check_folder(cfg.log_dir)
            except files.UnsafeFolder as e:
                return _setup_error(cfg, str(e))
            except OSError as e:
                return _setup_error(cfg, f"cannot create the log folder --log-dir {cfg.log_dir}: {e.strerror}")
        else:
            tmp_dir = tempfile.mkdtemp(prefix=f"pypto-launch-{cfg.job_id}-")
        from pypto_rt.launch.job_store import StoreError, open_job_store
        try:
            job_store = open_job_store(cfg)
        except StoreError as e:
            return _setup_error(cfg, str(e))
        try:
            specs = [_spec(cfg, local_rank, job_store.port, cfg.log_dir or tmp_dir)
                     for local_rank in range(cfg.nproc)]
        except OSError as e:
            return _setup_error(cfg, f"cannot clear a previous job's file {e.filename} in --log-dir: {e.strerror}")
        nodes = _Nodes(cfg, job_store.store) if cfg.nnodes > 1 else None
        with SignalWatch() as watch:
            return _supervise(cfg, specs, watch, job_store.store, nodes)
    finally:
        remove_segments(contract.shm_prefix(cfg.job_id))
        if job_store is not None:
            job_store.close()  # the store's server socket (and gateway or relay)
        if tmp_dir:
            shutil.rmtree(tmp_dir, ignore_errors=True)


def _spec(cfg: LaunchConfig, local_rank: int, port: int, folder: str) -> RankSpec:
    rank = cfg.global_rank(local_rank)
    error_file = os.path.join(folder, f"rank{rank}.error.json")
    stack_file = os.path.join(folder, f"rank{rank}.stack.txt")
    for stale in (error_file, error_file + ".tmp", stack_file):  # a previous job's must not be read as this one's
        files.remove(stale)
    env = contract.rank_env(os.environ, rank=rank, local_rank=local_rank, world_size=cfg.world_size,
                            local_world_size=cfg.nproc, master_addr=LOOPBACK, master_port=port,
                            comm=cfg.comm, job_id=cfg.job_id, secret=cfg.secret, error_file=error_file,
                            stack_file=stack_file, timeout_s=cfg.timeout_s)
    argv = [sys.executable, "-m", "pypto_rt.launch.rank_main", *(["-m"] if cfg.module else []), cfg.target,
            *cfg.args]
    logs = [os.path.join(cfg.log_dir, f"rank{rank}.{kind}.log") if cfg.log_dir else None
            for kind in ("stdout", "stderr")]
    return RankSpec(rank, local_rank, argv, env, error_file, echo=cfg.tee or not cfg.log_dir,
                    stdout_log=logs[0], stderr_log=logs[1], stack_file=stack_file)


class _Nodes:
    """A job across hosts: each node's launcher posts its first failure in the job's store and watches for
    another node's, so one failing rank ends the ranks of every host, not only its own."""
    KEY = "pypto-launch/failed"

    def __init__(self, cfg: LaunchConfig, store):
        self.node = cfg.node_rank
        self.store = store   # the job's scope of node 0's store

    def failed_elsewhere(self) -> str | None:
        try:
            if not self.store.check([self.KEY]):
                return None
            text = self.store.get(self.KEY).decode()
        except Exception:  # noqa: BLE001 - node 0's launcher ended (maybe its ranks all passed): no verdict
            return None
        return None if text.startswith(f"node {self.node}:") else text

    def post(self, text: str) -> None:
        try:
            self.store.compare_set(self.KEY, "", f"node {self.node}: {text}")   # the first node to fail wins
        except Exception:  # noqa: BLE001 - the store is gone: the other nodes see that instead
            pass


def _supervise(cfg: LaunchConfig, specs: list[RankSpec], watch: SignalWatch, store,
               nodes: _Nodes | None = None) -> JobResult:
    sup = Supervisor(specs, watch, remote_failure=nodes.failed_elsewhere if nodes else None,
                     on_exit=lambda r: _mark_exited(store, r))
    try:
        try:
            sup.start()
        except OSError as e:
            return JobResult(1, cfg.job_id, report=f"pypto-launch: cannot start the ranks ({sys.executable}): {e}")
        got_signal = sup.run()
        first = first_failure([_result(r) for r in sup.ranks if r.returncode is not None])
        if nodes is not None and first is not None:
            nodes.post(f"rank {first.rank} failed (exit code {first.returncode})")
        sup.end(settle_s=WAIT_SETTLE_S if first and first.record and first.record.get("wait") else 0.0,
                dump_stacks=first is not None)
    except BaseException:
        sup.kill_now()
        raise
    results = [_result(r) for r in sup.ranks]
    for r in sup.ranks:   # only the ranks asked for their stacks keep a stack file
        if not _text(r.spec.stack_file):
            with contextlib.suppress(OSError):
                files.remove(r.spec.stack_file)
    remote = sup.remote if first is None else None   # another node's failure ended this node's ranks
    code, report = _ending(cfg, results, got_signal, remote)
    root = None if remote else first_failure(results)   # the rank the report names, if any
    return job_result(code, cfg.job_id, results, root, got_signal, report)


def _ending(cfg: LaunchConfig, results: list[RankResult], got_signal: int | None,
            remote: str | None) -> tuple[int, str]:
    """The exit code of a job whose ranks ended as `results`, and what the launcher says at its end ("" when
    nothing). `remote`: another node's failure that ended this node's ranks before any of them failed itself."""
    if got_signal is None and all(r.returncode == 0 for r in results):
        strays = [str(r.rank) for r in results if r.left_processes]
        if strays:
            return 0, (f"pypto-launch: rank(s) {', '.join(strays)} exited 0 but left processes running; the "
                       "launcher ended them (wait for your child processes before exiting)")
        return 0, ""
    if remote:
        return 1, (f"pypto-launch: job {cfg.job_id}: ended this node's ranks because another node failed — "
                   f"{remote} (its launcher's summary has the error)")
    return 128 + got_signal if got_signal is not None else 1, summarize(results, cfg.job_id, got_signal)


def _mark_exited(store, r: RankProc) -> None:
    """Tell the ranks still in a start rendezvous that rank r will never come (pypto_rt.collective.store_rendezvous)."""
    from pypto_rt.collective.store_rendezvous import EXITED_KEY
    try:
        store.set(f"{EXITED_KEY}/{r.spec.rank}", str(r.returncode))
    except Exception:  # noqa: BLE001 - the store is gone (node 0 ended): its ranks are ending anyway
        pass


def _result(r: RankProc) -> RankResult:
    # a rank still unreaped after SIGKILL (stuck in the kernel) is reported as killed by it
    returncode = r.returncode if r.returncode is not None else -signal.SIGKILL
    return RankResult(rank=r.spec.rank, local_rank=r.spec.local_rank, pid=r.proc.pid, returncode=returncode,
                      ended_at=r.ended_at or time.time(), signalled=r.signalled, signalled_at=r.signalled_at,
                      record=read_record(r.spec.error_file), log=r.spec.stderr_log, left_processes=r.left_processes,
                      stack=_text(r.spec.stack_file) or None, stderr_tail=_stderr_tail(r))


def _stderr_tail(r: RankProc) -> str:
    """The end of what the rank wrote to stderr: as the launcher copied it, else from its log file."""
    if r.stderr is not None:
        data = r.stderr.tail
    else:
        try:
            data = files.tail_own(r.spec.stderr_log, TAIL_BYTES) if r.spec.stderr_log else b""
        except OSError:
            data = b""
    return data.decode("utf-8", "replace")


def _text(path: str | None) -> str:
    """A file the launcher or a rank made, or "" when absent or unreadable."""
    try:
        return files.read_own(path) if path else ""
    except OSError:
        return ""


def _setup_error(cfg: LaunchConfig, message: str) -> JobResult:
    return JobResult(2, cfg.job_id, report=f"pypto-launch: {message}")
