"""`pypto-run`: runs kernel-library style files unmodified; errors point at the user's line."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import default_signals, run_pypto

KERNEL = textwrap.dedent('''
    import pypto.language as pl
    from config import ROWS

    @pl.jit
    def k(x: pl.Tensor[[ROWS, 8], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, 8], pl.FP32]]):
        for r in pl.parallel(ROWS):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="neg"):
                y[r : r + 1, :] = {body}
        return y

    if __name__ == "__main__":
        import argparse
        import torch
        from golden import TensorSpec, run_jit

        parser = argparse.ArgumentParser()
        parser.add_argument("-p", "--platform", default="a2a3", choices=["a2a3", "a2a3sim", "a5", "a5sim"])
        args = parser.parse_args()
        specs = [TensorSpec("x", [ROWS, 8], torch.float32, init_value=torch.randn),
                 TensorSpec("y", [ROWS, 8], torch.float32, is_output=True)]
        def golden(v):
            v["y"][:] = -v["x"]
        result = run_jit(fn=k, specs=specs, golden_fn=golden, runtime_cfg=dict(platform=args.platform))
        if not result.passed:
            print(result.error)
            raise SystemExit(1)
''')


def _library(tmp_path, body="pl.neg(x[r : r + 1, :])"):
    """A fake kernel-library checkout: root with models/ and a config.py, the kernel in models/demo/."""
    (tmp_path / "models" / "demo").mkdir(parents=True)
    (tmp_path / "config.py").write_text("ROWS = 4\n")
    kernel = tmp_path / "models" / "demo" / "kernel.py"
    kernel.write_text(KERNEL.replace("{body}", body))
    return kernel


def test_library_file_runs_unmodified_with_npu_platform_notice(tmp_path):
    kernel = _library(tmp_path)
    proc = run_pypto(str(kernel), cwd=str(tmp_path / "models"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "needs an Ascend NPU; running on the CPU instead" in proc.stdout
    assert "'y' PASS" in proc.stdout


def test_kernel_error_names_the_user_line_without_internal_frames(tmp_path):
    kernel = _library(tmp_path, body="pl.row_expand_mul(x[r : r + 1, :])")
    proc = run_pypto(str(kernel), "-p", "a2a3sim")
    assert proc.returncode == 1
    assert f"--> {kernel}:9:" in proc.stderr
    assert "pl.row_expand_mul" in proc.stderr
    assert "pypto_rt" not in proc.stderr


def test_unknown_op_is_reported_at_the_user_line(tmp_path):
    kernel = _library(tmp_path, body="pl.negate(x[r : r + 1, :])")
    proc = run_pypto(str(kernel), "-p", "a2a3sim")
    assert proc.returncode == 1
    assert "unknown op or name pl.negate" in proc.stderr
    assert f"{kernel}:9:" in proc.stderr
    assert "pypto_rt/" not in proc.stderr


def test_usage_errors_exit_2(tmp_path):
    assert run_pypto(str(tmp_path / "missing.py")).returncode == 2
    kernel = _library(tmp_path)
    proc = run_pypto(str(kernel), "-p", "bogus")
    assert proc.returncode == 2  # the file's own argparse rejects it


def test_wrong_argument_dtype_is_reported_at_the_call_line(tmp_path):
    script = tmp_path / "call.py"
    script.write_text(textwrap.dedent('''
        import torch
        import pypto.language as pl

        @pl.jit
        def k(x: pl.Tensor[[4, 4], pl.BF16], y: pl.Out[pl.Tensor[[4, 4], pl.BF16]]):
            y[:, :] = pl.neg(x)
            return y

        k(torch.zeros(4, 4), torch.zeros(4, 4, dtype=torch.bfloat16))
    '''))
    proc = run_pypto(str(script))
    assert proc.returncode == 1
    assert f"--> {script}:10:" in proc.stderr
    assert "argument 'x' has dtype torch.float32, the kernel expects pl.BF16" in proc.stderr
    assert "pypto_rt/" not in proc.stderr


@pytest.mark.parametrize("executor", ["compiled", "reference"])
def test_pipeline_without_stage_is_reported(tmp_path, executor):
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent('''
        import torch
        import pypto.language as pl

        @pl.jit
        def k(x: pl.Tensor[[4, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
            with pl.at(level=pl.Level.CORE_GROUP):
                for i in pl.pipeline(4):
                    y[i : i + 1, :] = x[i : i + 1, :]
            return y

        k(torch.zeros(4, 4), torch.zeros(4, 4))
    '''))
    proc = run_pypto(str(script), env={"PYPTO_EXECUTOR": executor})
    assert proc.returncode == 1
    assert "pl.pipeline needs stage=" in proc.stderr
    assert f"{script}:8:" in proc.stderr
    assert "pypto_rt/" not in proc.stderr


def test_pipeline_outside_incore_code_runs_with_a_style_warning(tmp_path):
    script = tmp_path / "placement.py"
    script.write_text(textwrap.dedent('''
        import torch
        import pypto.language as pl

        @pl.jit
        def k(x: pl.Tensor[[4, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
            for i in pl.pipeline(4, stage=2):
                with pl.at(level=pl.Level.CORE_GROUP):
                    y[i : i + 1, :] = pl.add(x[i : i + 1, :], 1.0)
            return y

        y = k(torch.zeros(4, 4), torch.zeros(4, 4))
        raise SystemExit(0 if bool((y == 1.0).all()) else 1)
    '''))
    proc = run_pypto(str(script))
    assert proc.returncode == 0, proc.stderr
    assert f"{script}:7: StyleWarning: pl.pipeline outside InCore code runs as a sequential loop" in proc.stderr
    assert "pypto_rt/" not in proc.stderr


def test_refuses_to_share_an_environment_with_the_real_compiler(tmp_path):
    fake = tmp_path / "site" / "pypto"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("# stands in for the real PyPTO compiler package\n")
    kernel = _library(tmp_path)
    proc = run_pypto(str(kernel), env={"PYTHONPATH": str(tmp_path / "site")}, cwd=str(tmp_path))
    assert proc.returncode == 2
    assert "finds the real PyPTO compiler" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(60)
def test_sighup_stays_ignored_under_nohup(tmp_path):
    # nohup ignores SIGHUP before exec; pypto-run must not put its SIGTERM-like handler in place of that
    started = tmp_path / "started"
    prog = tmp_path / "prog.py"
    prog.write_text(f"import time\nopen({str(started)!r}, 'w').close()\ntime.sleep(1.5)\nprint('done')\n")
    proc = subprocess.Popen([sys.executable, "-m", "pypto_rt.pypto_run", str(prog)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "done" in out, out


# The host thread itself runs the task's block (an inline engine) and says so before looping over torch ops.
IN_KERNEL = textwrap.dedent('''
    import sys, time
    import torch
    from pypto_rt.aicpu import Engine

    def spin(block):
        print("in kernel", flush=True)
        a = torch.randn(64, 64)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            a @ a

    if sys.argv[1:] == ["sleep"]:
        print("in kernel", flush=True); time.sleep(60)   # one line: a signal right after the print lands here too
    with Engine(inline=True) as e:
        e.submit("spin", spin)
        e.finish()
''')


@pytest.mark.parametrize("where, user_line", [("sleep", r"line 14, in <module>"), ("kernel", r"line \d+, in spin")])
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signalled_run_says_so_in_one_line_and_exits_128_plus_the_signal(tmp_path, where, user_line, signum, code):
    path = tmp_path / "prog.py"
    path.write_text(IN_KERNEL)
    proc = subprocess.Popen([sys.executable, "-m", "pypto_rt.pypto_run", str(path), where], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_signals)
    try:
        assert proc.stdout.readline() == "in kernel\n"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    if signum == signal.SIGTERM:
        assert re.fullmatch(f"pypto-run: terminated by SIGTERM during {re.escape(str(path))} \\({user_line}\\); "
                            "exit 143", err.strip()), err
    else:
        assert err.strip() == "pypto-run: interrupted"


REAL_RUNTIME_USER = textwrap.dedent('''
    import pypto.language as pl
    from pypto.runtime import RunConfig

    print("not reached")
''')


@pytest.mark.parametrize("runner", ["pypto-run", "python"])
def test_a_file_needing_the_real_runtime_says_so_in_one_sentence(tmp_path, runner):
    script = tmp_path / "needs_runtime.py"
    script.write_text(REAL_RUNTIME_USER)
    if runner == "pypto-run":
        proc = run_pypto(str(script))
    else:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "error: `pypto.runtime` belongs to the real PyPTO runtime" in proc.stderr
    assert "pypto-rt provides `pypto.language` only, so this file needs the real PyPTO stack" in proc.stderr
    assert f"--> {script}:3:" in proc.stderr
    assert "No module named" not in proc.stderr and "not reached" not in proc.stdout
    if runner == "pypto-run":
        assert "pypto_rt/" not in proc.stderr and "Traceback" not in proc.stderr


def test_optional_imports_of_real_pypto_modules_still_fall_back():
    code = ("try:\n    from pypto.backend import BackendType\nexcept ImportError:\n    BackendType = None\n"
            "import pypto.language.distributed, pypto.ir.distributed_compiled_program\nprint(BackendType)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, "None"), proc.stderr
