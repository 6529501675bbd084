"""User mistakes and runtime failures on the compiled runtime, as `pypto-run` reports them: exit 1, the user's
file:line, what to do, and no pypto_rt frames."""
from __future__ import annotations

import textwrap
import time

from tests.conftest import run_pypto

HEADER = '''
import threading
import torch
import pypto.language as pl
from golden import TensorSpec, run_jit
'''


def run_script(tmp_path, body: str, env=None, timeout=120):
    script = tmp_path / "prog.py"
    script.write_text(HEADER + textwrap.dedent(body))
    return script, run_pypto(str(script), env=env, timeout=timeout)


def line_of(script, text: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def assert_user_error(proc, script, text, *needles):
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"--> {script}:{line_of(script, text)}:" in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert "pypto_rt/" not in proc.stderr and "Traceback" not in proc.stderr


def test_parallel_inside_pl_at_warns_at_its_line_also_from_the_disk_cache(tmp_path):
    body = '''
        @pl.jit
        def k(x: pl.Tensor[[8, 8], pl.FP32], y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
            with pl.at(level=pl.Level.CORE_GROUP):
                for r in pl.parallel(0, 8, 4):
                    y[r : r + 4, :] = pl.add(x[r : r + 4, :], 1.0)
            return y

        y = k(torch.zeros(8, 8), torch.zeros(8, 8))
        raise SystemExit(0 if bool((y == 1.0).all()) else 1)
    '''
    cache = {"PYPTO_CACHE_DIR": str(tmp_path / "cache")}
    for run in ("compiled now", "loaded from the disk cache"):
        script, proc = run_script(tmp_path, body, env=cache)
        assert proc.returncode == 0, (run, proc.stderr)
        warning = f"{script}:{line_of(script, 'pl.parallel(0, 8, 4)')}: StyleWarning: pl.parallel inside InCore code"
        assert proc.stderr.count(warning) == 1, (run, proc.stderr)
    assert any((tmp_path / "cache").iterdir())


def test_compared_output_annotated_in(tmp_path):
    script, proc = run_script(tmp_path, '''
        @pl.jit
        def k(x: pl.Tensor[[8, 8], pl.FP32], y: pl.Tensor[[8, 8], pl.FP32]):
            with pl.at(level=pl.Level.CORE_GROUP):
                y[:, :] = pl.add(x, 1.0)
            return y

        def golden(t):
            t["y"][:] = t["x"] + 1.0

        specs = [TensorSpec("x", [8, 8], torch.float32, init_value=torch.randn),
                 TensorSpec("y", [8, 8], torch.float32, is_output=True)]
        raise SystemExit(0 if run_jit(fn=k, specs=specs, golden_fn=golden).passed else 1)
    ''')
    assert proc.returncode == 1
    assert "annotated In" in proc.stdout + proc.stderr and "pl.Out" in proc.stdout + proc.stderr


def test_dtype_mismatch_at_the_call(tmp_path):
    # a shape other than annotated is a warning (the call runs for the shapes passed); a dtype stays an error
    script, proc = run_script(tmp_path, '''
        @pl.jit
        def k(x: pl.Tensor[[8, 8], pl.FP32], y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
            with pl.at(level=pl.Level.CORE_GROUP):
                y[:, :] = pl.add(x, 1.0)
            return y

        k(torch.zeros(8, 8, dtype=torch.int32), torch.zeros(8, 8))
    ''')
    assert_user_error(proc, script, "k(torch.zeros(8, 8, dtype=torch.int32)", "argument 'x'")


def test_failing_task(tmp_path):
    script, proc = run_script(tmp_path, '''
        @pl.jit
        def k(x: pl.Tensor[[8, 8], pl.FP32], w: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
            for r in pl.parallel(0, 8, 4):
                with pl.at(level=pl.Level.CORE_GROUP, name_hint="proj"):
                    y[r : r + 4, :] = pl.matmul(x[r : r + 4, :], w)
            return y

        k(torch.zeros(8, 8), torch.zeros(4, 8), torch.zeros(8, 8))
    ''')
    assert_user_error(proc, script, "pl.matmul(x[r", "task 'proj'", "pl.matmul")


def test_a_stuck_task_ends_with_a_stall_report(tmp_path):
    start = time.monotonic()
    script, proc = run_script(tmp_path, '''
        NEVER = threading.Event()

        def wait_for_a_signal_that_never_comes():
            NEVER.wait(60)

        @pl.jit
        def k(x: pl.Tensor[[8, 8], pl.FP32], y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
            h = pl.create_tensor([8, 8], dtype=pl.FP32)
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="stuck"):
                wait_for_a_signal_that_never_comes()
                h = pl.assemble(h, pl.add(x, 1.0), [0, 0])
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="consumer"):
                y[:, :] = pl.add(h, 1.0)
            return y

        k(torch.zeros(8, 8), torch.zeros(8, 8))
    ''', env={"PYPTO_TIMEOUT_S": "1"})
    assert time.monotonic() - start < 50   # its 1 s deadline, not the stuck block's 60 s (generous: loaded hosts)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = proc.stderr
    assert "made no progress" in report and "1 running" in report and "1 waiting" in report
    assert "'stuck'" in report and "'consumer'" in report
    stuck_line = line_of(script, 'name_hint="stuck"')
    assert f"{script}:{stuck_line}" in report
    assert "pypto_rt/" not in report


def test_a_short_kernel_that_gets_stuck_on_the_host_thread_is_reported(tmp_path):
    start = time.monotonic()
    script, proc = run_script(tmp_path, '''
        CALLS = [0]
        NEVER = threading.Event()

        def stuck_on_the_sixth_call():
            CALLS[0] += 1
            if CALLS[0] == 6:
                NEVER.wait(60)

        @pl.jit
        def k(x: pl.Tensor[[8, 8], pl.FP32], y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="usually_quick"):
                stuck_on_the_sixth_call()
                y[:, :] = pl.add(x, 1.0)
            return y

        for _ in range(8):
            k(torch.zeros(8, 8), torch.zeros(8, 8))
    ''', env={"PYPTO_TIMEOUT_S": "1", "PYPTO_HOST_INLINE_US": "10000000"})   # any kernel that ran before inlines
    assert time.monotonic() - start < 50   # its 1 s deadline, not the stuck block's 60 s (generous: loaded hosts)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "made no progress" in proc.stderr and "'usually_quick'" in proc.stderr
    assert "running on the host thread" in proc.stderr
