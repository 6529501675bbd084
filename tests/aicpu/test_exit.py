"""How a process ends while a worker of a failed, stalled or closed run is still inside a kernel.

A daemon worker that re-takes the GIL inside torch's C++ frames during interpreter teardown aborts the process
("terminate called without an active exception", exit 134). Each test runs a fresh interpreter and asserts its
own exit code and a stderr free of that abort.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import run_pypto

ABORT = "terminate called"

# A run whose task 'spin' loops over small torch ops (it would go on for minutes) while task 'boom' raises.
ENGINE_RUN = textwrap.dedent('''
    import sys, threading, time
    import torch
    from pypto_rt.aicpu import Engine

    a = torch.randn(128, 128)
    spinning = threading.Event()

    def spin(block):
        spinning.set()
        end = time.monotonic() + 300
        while time.monotonic() < end:
            a @ a

    def boom(block):
        spinning.wait(30)
        raise ValueError("boom")

    def failed_run():
        try:
            with Engine(num_workers=2, timeout_s=0.5) as e:
                e.submit("spin", spin)
                e.submit("boom", boom)
                e.finish()
        except Exception as exc:
            print("caught", type(exc).__name__, file=sys.stderr)
''')


def _python(tmp_path, source: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "prog.py"
    path.write_text(source)
    full_env = {**os.environ, "PYPTO_HOST_INLINE_US": "0", **(env or {})}
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=120,
                          env=full_env)


def test_a_script_that_catches_a_failed_run_exits_with_its_own_code(tmp_path):
    proc = _python(tmp_path, ENGINE_RUN + "failed_run()\nsys.exit(3)\n")
    assert proc.returncode == 3, proc.stderr
    assert "caught TaskFailedError" in proc.stderr and ABORT not in proc.stderr


def test_an_uncaught_failure_exits_1(tmp_path):
    source = ENGINE_RUN.replace("except Exception as exc:", "except ZeroDivisionError as exc:")
    proc = _python(tmp_path, source + "failed_run()\n")
    assert proc.returncode == 1, proc.stderr
    assert "ValueError: boom" in proc.stderr and ABORT not in proc.stderr


def test_the_abandoned_worker_leaves_its_kernel_and_the_next_run_is_unharmed(tmp_path):
    source = ENGINE_RUN + textwrap.dedent('''
        failed_run()
        out = []
        with Engine(num_workers=2, timeout_s=10) as e:
            for i in range(4):
                e.submit(f"t{i}", lambda b, i=i: out.append(int((torch.ones(8) * i).sum())))
            e.finish()
        assert sorted(out) == [0, 8, 16, 24], out
        # the old pool's thread left 'spin' at its next op: only the new pool's two workers are left
        deadline = time.monotonic() + 10
        while len([t for t in threading.enumerate() if t.name.startswith("pypto-rt worker")]) > 2:
            assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
            time.sleep(0.05)
        print("next run ok", file=sys.stderr)
    ''')
    proc = _python(tmp_path, source)
    assert proc.returncode == 0, proc.stderr
    assert "next run ok" in proc.stderr and ABORT not in proc.stderr


# A @pl.jit kernel whose two blocks each loop over matmuls for minutes: with PYPTO_TIMEOUT_S=1 it stalls.
JIT_STALL = textwrap.dedent('''
    import sys
    import torch
    import pypto.language as pl

    N = 256

    @pl.jit
    def spin(a: pl.Tensor[[N, N], pl.FP32], c: pl.Out[pl.Tensor[[2 * N, N], pl.FP32]]):
        for i in pl.parallel(2):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="spin"):
                acc = pl.matmul(a, a)
                for s in pl.range(1000000):
                    acc = pl.matmul(acc, a)
                c[i * N : i * N + N, :] = acc
        return c

    @pl.jit
    def neg(x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="neg"):
            y[:, :] = pl.neg(x)
        return y

    if __name__ == "__main__":
        c = torch.zeros(2 * N, N)
        try:
            spin(torch.eye(N), c)
        except Exception as exc:
            print("caught", type(exc).__name__, file=sys.stderr)
            if sys.argv[1:] == ["reraise"]:
                raise
        x = torch.randn(N, N)
        y = torch.zeros(N, N)
        neg(x, y)
        assert torch.equal(y, -x) and not c.any()
        print("next kernel ok", file=sys.stderr)
''')


def test_a_plain_python_script_survives_a_stall_and_runs_the_next_kernel(tmp_path):
    proc = _python(tmp_path, JIT_STALL, env={"PYPTO_TIMEOUT_S": "1", "PYPTO_HOST_INLINE_US": "50"})
    assert proc.returncode == 0, proc.stderr
    assert "caught StallError" in proc.stderr and "next kernel ok" in proc.stderr
    assert ABORT not in proc.stderr


def test_pypto_run_reporting_a_stall_exits_1(tmp_path):
    path = tmp_path / "stall.py"
    path.write_text(JIT_STALL)
    proc = run_pypto(str(path), "reraise", env={"PYPTO_TIMEOUT_S": "1", "PYPTO_HOST_INLINE_US": "0"}, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "made no progress for" in proc.stderr and ABORT not in proc.stderr


# A worker blocked inside one C++ call that no stop request can end (a torch Future nobody completes).
STUCK_IN_TORCH = textwrap.dedent('''
    import sys
    import torch
    from pypto_rt.aicpu import Engine, workers

    workers.EXIT_GRACE_S = 0.2
    never = torch.futures.Future()
    try:
        with Engine(num_workers=1, timeout_s=0.3) as e:
            e.submit("stuck", lambda b: never.wait())
            e.finish()
    except Exception as exc:
        print("caught", type(exc).__name__, file=sys.stderr)
    print("script done", flush=True)
''')


def test_a_worker_that_cannot_be_stopped_ends_the_process_early_with_a_line(tmp_path):
    proc = _python(tmp_path, STUCK_IN_TORCH)
    assert proc.returncode == 1, proc.stderr   # a plain script's own exit code is not visible at exit
    assert "script done" in proc.stdout
    assert "pypto-rt worker 0 still inside a kernel of a closed run" in proc.stderr and ABORT not in proc.stderr


def test_pypto_run_keeps_its_exit_code_when_a_worker_cannot_be_stopped(tmp_path):
    path = tmp_path / "stuck.py"
    path.write_text(STUCK_IN_TORCH)
    proc = run_pypto(str(path), env={"PYPTO_HOST_INLINE_US": "0"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "script done" in proc.stdout and "ending the process now with exit code 0" in proc.stderr


def test_a_pytest_process_whose_test_caught_a_failed_run_exits_0(tmp_path):
    test_file = tmp_path / "test_failed_run.py"
    test_file.write_text(ENGINE_RUN + "\n\ndef test_it():\n    failed_run()\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          env={**os.environ, "PYPTO_HOST_INLINE_US": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and ABORT not in proc.stderr
