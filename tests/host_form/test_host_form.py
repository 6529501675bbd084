"""The host form: a @pl.jit.host program dispatches chip programs with device=r to rank processes the runtime
starts itself; failures and hangs end the program with a report, and /dev/shm is left clean."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import default_signals

PROGRAM = textwrap.dedent('''
    import torch
    import pypto.language as pl
    import pypto.language.distributed as pld
    from pypto.ir.distributed_compiled_program import DistributedConfig
    from golden import TensorSpec, run_jit

    N = 3
    SIZE = 64

    @pl.jit
    def exchange(inp: pl.Tensor[[1, SIZE], pl.FP32], out: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pld.DistributedTensor[[1, SIZE], pl.FP32], signal: pld.DistributedTensor[[N, 1], pl.INT32],
                 me: pl.Scalar[pl.INT32]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="ring_step"):
            data = pl.store(pl.load(inp, [0, 0], [1, SIZE]), [0, 0], data)
            nxt = (me + 1) % N
            pld.system.notify(signal, peer=nxt, offsets=[me, 0], value=1, op=pld.NotifyOp.AtomicAdd)
            prev = (me + N - 1) % N
            pld.system.wait(signal=signal, offsets=[prev, 0], expected=EXPECTED, cmp=pld.WaitCmp.Ge)
            FAIL_HERE
            out[:, :] = pld.tile.remote_load(data, peer=prev, offsets=[0, 0], shape=[1, SIZE])
        return out

    @pl.jit.host
    def ring(inputs: pl.Tensor[[N, 1, SIZE], pl.FP32], outputs: pl.Out[pl.Tensor[[N, 1, SIZE], pl.FP32]]):
        data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
        signal_buf = pld.alloc_window_buffer([N, 1], dtype=pl.INT32)
        for r in pl.range(pld.world_size()):
            exchange(inputs[r], outputs[r], pld.window(data_buf, [1, SIZE], dtype=pl.FP32),
                     pld.window(signal_buf, [N, 1], dtype=pl.INT32), r, device=r)

    def golden(values):
        values["outputs"][:] = values["inputs"].roll(1, dims=0)

    specs = [TensorSpec("inputs", [N, 1, SIZE], torch.float32, init_value=torch.randn),
             TensorSpec("outputs", [N, 1, SIZE], torch.float32, is_output=True)]
    result = run_jit(fn=ring, specs=specs, golden_fn=golden,
                     compile_cfg=dict(distributed_config=DistributedConfig(device_ids=list(range(N)))))
    if not result.passed:
        print(result.error)
    raise SystemExit(0 if result.passed else 1)
''')


_WAIT_HINT = "check that every rank notifies the cells its peers wait for"


def _run(tmp_path, expected="1", fail_here="pass", env=None, timeout=120, program=PROGRAM):
    path = tmp_path / "ring.py"
    path.write_text(program.replace("EXPECTED", expected).replace("FAIL_HERE", fail_here))
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pypto_rt.pypto_run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    stdout, stderr = proc.communicate(timeout=timeout)
    elapsed = time.monotonic() - start
    leftovers = glob.glob(f"/dev/shm/pypto-{proc.pid}-*")   # the host process names (and owns) its job's segments
    assert not leftovers, f"segments left behind: {sorted(leftovers)}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), elapsed, str(path)


@pytest.mark.timeout(120)
def test_a_ring_exchange_runs_on_rank_processes_and_writes_the_callers_outputs(tmp_path):
    proc, _, _ = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[RUN] PASS" in proc.stdout


@pytest.mark.timeout(120)
def test_a_rank_that_raises_ends_the_program_naming_the_rank_and_the_line(tmp_path):
    proc, elapsed, path = _run(tmp_path, fail_here="assert me != 1, 'rank one gives up'")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "rank 1 failed first" in out and "rank one gives up" in out, out[-3000:]
    assert f"{os.path.basename(path)}:" in out
    assert elapsed < 60


@pytest.mark.timeout(120)
def test_a_wait_that_can_never_be_satisfied_ends_with_a_wait_report(tmp_path):
    proc, elapsed, _ = _run(tmp_path, expected="2", env={"PYPTO_TIMEOUT_S": "3"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "ring_step" in out, out[-3000:]   # the region the wait was in
    assert "expected" in out and "seen 1" in out, out[-3000:]
    assert _WAIT_HINT in out, out[-3000:]   # the root cause is the wait itself
    assert elapsed < 60


@pytest.mark.timeout(120)
def test_a_rank_that_raises_gets_no_wait_hint_though_its_peers_then_fail_their_waits(tmp_path):
    # rank 1 raises before it notifies rank 2, whose wait then fails (rank 1 aborted): a wait report, but the
    # root cause is the raise, so a hint about notifies would mislead
    program = PROGRAM.replace("        nxt = (me + 1) % N",
                              "        assert me != 1, 'rank one gives up'\n        nxt = (me + 1) % N", 1)
    assert "rank one gives up" in program
    proc, _, _ = _run(tmp_path, program=program, env={"PYPTO_TIMEOUT_S": "30"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "rank 1 failed first" in out and "rank one gives up" in out, out[-3000:]
    assert "rank 2 waits in `wait`" in out, out[-3000:]   # the peer's failed wait is reported
    assert _WAIT_HINT not in out, out[-3000:]


def _start_waiting_ring(tmp_path, **popen_args):
    """pypto-run on a ring whose ranks wait (60 s) inside their kernel; returns once they hold their windows.
    Its output goes to tmp_path/out.log (not a pipe, which orphaned ranks would keep open)."""
    path = tmp_path / "ring.py"
    path.write_text(PROGRAM.replace("EXPECTED", "2").replace("FAIL_HERE", "pass"))
    with open(tmp_path / "out.log", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pypto_rt.pypto_run", str(path)], stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYPTO_TIMEOUT_S": "60"},
                                preexec_fn=default_signals, **popen_args)
    deadline = time.monotonic() + 60
    while not glob.glob(f"/dev/shm/pypto-{proc.pid}-*-w1-*") and time.monotonic() < deadline:
        time.sleep(0.2)   # until the ranks hold their windows
    if not glob.glob(f"/dev/shm/pypto-{proc.pid}-*-w1-*"):
        proc.kill()
        pytest.fail("the job never started: " + (tmp_path / "out.log").read_text()[-3000:])
    return proc


def _live_processes(session: int) -> list[int]:
    """The processes of a session that still run (a zombie has ended: it only waits to be reaped)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _ppid, _pgrp, sid = f.read().rsplit(")", 1)[1].split()[:4]
        except OSError:
            continue
        if int(sid) == session and state != "Z":
            found.append(int(pid))
    return found


@pytest.mark.timeout(120)
def test_sigterm_to_the_host_process_ends_the_ranks_and_removes_the_segments(tmp_path):
    proc = _start_waiting_ring(tmp_path)
    proc.terminate()
    proc.wait(timeout=30)
    assert proc.returncode == 143
    out = (tmp_path / "out.log").read_text()
    assert "pypto-run: terminated by SIGTERM during" in out, out[-3000:]
    assert not glob.glob(f"/dev/shm/pypto-{proc.pid}-*")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_the_ranks_end_and_remove_the_segments_when_pypto_run_is_killed_or_hung_up(tmp_path, signum):
    # SIGKILL leaves the host no cleanup: its ranks see it die (mid-kernel, in a wait) and the last one out
    # removes the segments; SIGHUP (a closed terminal) ends pypto-run like SIGTERM
    proc = _start_waiting_ring(tmp_path, start_new_session=True)   # its session holds the ranks and nothing else
    try:
        assert len(_live_processes(proc.pid)) == 1 + 3, "pypto-run and its three ranks"
        proc.send_signal(signum)
        ended = time.monotonic()
        proc.wait(timeout=30)
        while (_live_processes(proc.pid) or glob.glob(f"/dev/shm/pypto-{proc.pid}-*")) and \
                time.monotonic() < ended + 3:
            time.sleep(0.05)
        assert not _live_processes(proc.pid), "rank processes outlived pypto-run"
        assert not glob.glob(f"/dev/shm/pypto-{proc.pid}-*"), "segments outlived the job"
        if signum == signal.SIGHUP:
            out = (tmp_path / "out.log").read_text()
            assert proc.returncode == 128 + signal.SIGHUP, out[-3000:]
            assert "pypto-run: terminated by SIGHUP during" in out, out[-3000:]
    finally:
        for pid in _live_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        for leftover in glob.glob(f"/dev/shm/pypto-{proc.pid}-*"):
            os.unlink(leftover)


@pytest.mark.timeout(120)
def test_ranks_forked_after_the_host_used_openmp_run_parallel_sized_torch_ops(tmp_path):
    # the host's OpenMP team (2 threads, used before the fork) does not exist in a forked rank: a rank whose
    # first parallel-sized op entered a parallel region waited for it forever
    program = PROGRAM.replace("import torch\n", "import torch\ntorch.set_num_threads(2)\n"
                              "(torch.randn(1024, 1024) @ torch.randn(1024, 1024)).sum()\n", 1)
    program = program.replace(
        '    with pl.at(level=pl.Level.CORE_GROUP, name_hint="ring_step"):',
        '    scratch = pl.create_tensor([4096, 1024], dtype=pl.FP32)\n'
        '    with pl.at(level=pl.Level.CORE_GROUP, name_hint="ring_step"):', 1)
    assert "scratch" in program and "set_num_threads(2)" in program
    proc, elapsed, _ = _run(tmp_path, program=program, env={"PYPTO_TIMEOUT_S": "30"}, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert elapsed < 60


SHAPED = textwrap.dedent('''
    import torch
    import pypto.language as pl
    from pypto.ir.distributed_compiled_program import DistributedConfig
    from golden import TensorSpec, run_jit

    N, SIZE = 2, 8

    @pl.jit
    def add_one(inp: pl.Tensor[[1, 2 * SIZE], pl.FP32], out: pl.Out[pl.Tensor[[1, 2 * SIZE], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_one"):
            out[:, :] = pl.add(inp[:, :], 1.0)
        return out

    @pl.jit.host
    def each(inputs: pl.Tensor[[N, 1, SIZE], pl.FP32], outputs: pl.Out[pl.Tensor[[N, 1, SIZE], pl.FP32]]):
        for r in pl.range(N):
            add_one(inputs[r], outputs[r], device=r)   # DISPATCH

    def golden(values):
        values["outputs"][:] = values["inputs"] + 1

    specs = [TensorSpec("inputs", [N, 1, SIZE], torch.float32, init_value=torch.randn),
             TensorSpec("outputs", [N, 1, SIZE], torch.float32, is_output=True)]
    result = run_jit(fn=each, specs=specs, golden_fn=golden,
                     compile_cfg=dict(distributed_config=DistributedConfig(device_ids=list(range(N)))))
    raise SystemExit(0 if result.passed else 1)
''')


@pytest.mark.timeout(120)
def test_a_dispatch_of_another_shape_than_annotated_warns_once_at_the_dispatch_line(tmp_path):
    """Every rank binds the same shapes; the host gives their EntryShapeWarning once, where the host program
    dispatched."""
    proc, _, path = _run(tmp_path, program=SHAPED)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(i for i, text in enumerate(SHAPED.splitlines(), 1) if text.endswith("# DISPATCH"))
    assert proc.stderr.count("EntryShapeWarning") == 1, proc.stderr[-3000:]
    assert f"{path}:{line}: EntryShapeWarning: add_one: 'inp' has shape [1, 8]" in proc.stderr, proc.stderr[-3000:]


def test_a_signal_while_the_job_ends_still_removes_its_segments():
    # SIGTERM arriving while the host waits for its ranks to leave (seen with `timeout` on a library model): the
    # ranks had been told to exit and were gone, so the job's segments had nobody left to remove them
    from pypto_rt.collective.segments import list_segments, path_of, segment_name
    from pypto_rt.host_form.forked_job import ForkedJob
    from pypto_rt.host_form.lifeline import Lifeline

    class RankLeaving:
        signalled = False

        def join(self, timeout=None):
            if not self.signalled:   # the signal arrives once, in the first wait for the rank
                self.signalled = True
                raise SystemExit(143)   # what pypto-run's SIGTERM handler raises on the host thread

        def is_alive(self):
            return False

    job = ForkedJob.__new__(ForkedJob)
    job.prefix = f"pypto-test-{os.getpid()}-closing"
    job.conns, job.procs, job.store = [], [RankLeaving()], None
    job.lifeline = Lifeline(job.prefix)
    open(path_of(segment_name(job.prefix, "w0-r0")), "w").close()
    try:
        with pytest.raises(SystemExit):
            job.close()
        assert list_segments(job.prefix) == []
    finally:
        for leftover in glob.glob(f"/dev/shm/{job.prefix}*"):
            os.unlink(leftover)
