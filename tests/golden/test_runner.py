"""run_jit / run: stages, console lines, platforms, golden data, failures, thread setup."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import pypto.language as pl
import pypto_rt.golden as golden
from pypto_rt.errors import PyptoError
from pypto_rt.golden import RunResult, ScalarSpec, TensorSpec, run, run_jit


def specs():
    return [TensorSpec("x", [4, 8], torch.float32, init_value=torch.randn),
            ScalarSpec("a", torch.float32, 1.5),
            TensorSpec("y", [4, 8], torch.float32, is_output=True)]


def add_kernel(x, a, y):
    y[:] = x + a


def add_golden(values):
    values["y"][:] = values["x"] + values["a"]


def lines(capsys):
    return [ln for ln in capsys.readouterr().out.splitlines()]


def stage_names(out):
    return [ln for ln in out if ln.startswith("[RUN] ") and not ln.startswith("[RUN]  ")]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("PYPTO_RUN_CPU_FALLBACK", "PYPTO_BENCH"):
        monkeypatch.delenv(name, raising=False)


class TestRunResult:
    def test_str(self):
        assert str(RunResult(True, execution_time=1.234)) == "PASS (1.23s)"
        assert str(RunResult(False, error="boom", execution_time=0.5)) == "FAIL: boom (0.50s)"
        assert str(RunResult(False)) == "FAIL"
        assert RunResult(True).work_dir is None and RunResult(True).bench is None


class TestRunJit:
    def test_pass_prints_stages_in_order(self, capsys):
        result = run_jit(add_kernel, specs(), golden_fn=add_golden, runtime_cfg=dict(platform="a2a3sim"))
        assert result.passed and result.error is None and result.execution_time >= 0
        out = lines(capsys)
        names = [ln.split(" (")[0] for ln in stage_names(out)]
        assert names == ["[RUN] compile ...", "[RUN] compile done", "[RUN] generate inputs ...",
                         "[RUN] generate inputs done", "[RUN] compute golden ...", "[RUN] compute golden done",
                         "[RUN] runtime ...", "[RUN] runtime done", "[RUN] validate ...", "[RUN] validate done",
                         "[RUN] PASS"]
        assert "[RUN]   'y' PASS  shape=(4, 8) dtype=torch.float32" in out
        assert out[-1].startswith("[RUN] PASS (") and out[-1].endswith("s)")

    def test_kernel_gets_harness_tensors_and_python_scalars(self):
        seen = {}

        def kernel(x, a, y):
            seen.update(x=x, a=a, y=y)
            add_kernel(x, a, y)

        assert run_jit(kernel, specs(), golden_fn=add_golden).passed
        assert isinstance(seen["x"], torch.Tensor) and seen["x"].shape == (4, 8)
        assert type(seen["a"]) is float and seen["a"] == 1.5
        assert torch.equal(seen["y"], seen["x"] + 1.5)  # output written in place is what was compared

    def test_golden_works_on_copies_of_the_same_inputs(self):
        seen = {}

        def golden_fn(values):
            seen["x_golden"] = values["x"].clone()
            add_golden(values)
            values["x"].zero_()  # must not leak into the kernel's input

        def kernel(x, a, y):
            seen["x_kernel"] = x.clone()
            add_kernel(x, a, y)

        assert run_jit(kernel, specs(), golden_fn=golden_fn).passed
        assert torch.equal(seen["x_golden"], seen["x_kernel"])
        assert seen["x_kernel"].abs().sum() > 0

    def test_inout_initial_value_and_golden_runs_first(self):
        order = []
        state = [TensorSpec("c", [3], torch.int32, init_value=lambda: [1, 2, 3], is_output=True)]

        def golden_fn(values):
            order.append(("golden", values["c"].tolist()))
            values["c"] += 10

        def kernel(c):
            order.append(("kernel", c.tolist()))
            c += 10

        assert run_jit(kernel, state, golden_fn=golden_fn).passed
        assert order == [("golden", [1, 2, 3]), ("kernel", [1, 2, 3])]

    def test_mismatch_is_failed_result(self, capsys):
        result = run_jit(lambda x, a, y: None, specs(), golden_fn=add_golden)
        assert not result.passed
        assert result.error.startswith("Output(s) does not match golden: ['y']")
        assert "Mismatched elements: 32/32  rtol=1e-05 atol=1e-05" in result.error
        out = lines(capsys)
        assert "[RUN]   'y' FAIL  shape=(4, 8) dtype=torch.float32" in out
        assert not any(ln.startswith("[RUN] PASS") for ln in out)

    def test_tolerances_and_compare_fn(self):
        def off_by_a_bit(x, a, y):
            y[:] = x + a + 0.01

        assert not run_jit(off_by_a_bit, specs(), golden_fn=add_golden).passed
        assert run_jit(off_by_a_bit, specs(), golden_fn=add_golden, rtol=0.0, atol=0.02).passed
        seen = {}

        def loose(actual, expected, *, actual_outputs, expected_outputs, inputs, rtol, atol):
            seen.update(inputs=inputs, rtol=rtol)
            return True, ""

        assert run_jit(off_by_a_bit, specs(), golden_fn=add_golden, compare_fn={"y": loose}, rtol=0.125).passed
        assert set(seen["inputs"]) == {"x", "a"} and seen["rtol"] == 0.125
        assert seen["inputs"]["a"].ndim == 0 and seen["inputs"]["a"].dtype == torch.float32

    def test_no_save_data_no_work_dir(self):
        assert run_jit(add_kernel, specs(), golden_fn=add_golden).work_dir is None

    def test_no_golden_skips_validation(self, capsys):
        assert run_jit(add_kernel, specs()).passed
        out = lines(capsys)
        assert "[RUN] compute golden ..." not in out and "[RUN] validate ..." not in out
        assert out[-1].startswith("[RUN] PASS (")
        assert out[-1].endswith("s, validation skipped: no golden_fn or golden_data)")

    def test_no_output_spec_says_nothing_was_compared(self, capsys):
        only_inputs = [TensorSpec("x", [2], torch.float32)]
        assert run_jit(lambda x: None, only_inputs, golden_fn=lambda v: None).passed
        out = lines(capsys)
        assert "[RUN] validate ..." not in out
        assert out[-1].endswith("s, nothing was compared: no TensorSpec has is_output=True)")

    def test_unknown_config_keys_are_ignored(self):
        cfg = dict(platform="a5sim", device_id=3, enable_chip_swimlane=True, enable_pmu=1, enable_dep_gen=True,
                   enable_dump_args=True, enable_scope_stats=True, log_level="debug", something_new=1)
        result = run_jit(add_kernel, specs(), golden_fn=add_golden, runtime_cfg=cfg,
                         compile_cfg=dict(dump_passes=True, distributed_config=None))
        assert result.passed
        assert cfg["log_level"] == "debug"  # the caller's dict is not modified

    def test_duplicate_spec_names_fail(self):
        dup = specs() + [TensorSpec("x", [1], torch.float32)]
        result = run_jit(add_kernel, dup)
        assert not result.passed and "'x'" in result.error


class TestCompileStage:
    class Jitted:
        def __init__(self):
            self.compiled_with = None
            self.calls = 0

        def compile(self, *args):
            self.compiled_with = args

        def __call__(self, x, a, y):
            self.calls += 1
            add_kernel(x, a, y)

    def test_compile_called_with_dummy_args(self):
        fn = self.Jitted()
        assert run_jit(fn, specs(), golden_fn=add_golden).passed
        x, a, y = fn.compiled_with
        assert (x.shape, x.dtype, y.shape) == ((4, 8), torch.float32, (4, 8))
        assert a == 1.5 and fn.calls == 1

    def test_compile_only(self, capsys):
        fn = self.Jitted()
        result = run_jit(fn, specs(), golden_fn=add_golden, compile_only=True)
        assert result.passed and fn.compiled_with is not None and fn.calls == 0
        out = lines(capsys)
        assert [ln.split(" (")[0] for ln in out] == ["[RUN] compile ...", "[RUN] compile done", "[RUN] PASS"]

    def test_compile_only_with_runtime_dir_fails(self, tmp_path):
        result = run_jit(self.Jitted(), specs(), compile_only=True, runtime_dir=str(tmp_path))
        assert not result.passed and "runtime_dir is incompatible with compile_only" == result.error

    def test_compile_error_propagates_after_done_line(self, capsys):
        class Broken:
            def compile(self, *args):
                raise RuntimeError("bad kernel")

            def __call__(self, *args):
                raise AssertionError("never called")

        with pytest.raises(RuntimeError, match="bad kernel"):
            run_jit(Broken(), specs())
        assert lines(capsys)[-1].startswith("[RUN] compile done (")

    def test_runtime_dir_skips_compile(self, tmp_path, capsys):
        fn = self.Jitted()
        result = run_jit(fn, specs(), golden_fn=add_golden, runtime_dir=str(tmp_path))
        assert result.passed and result.work_dir == tmp_path and fn.compiled_with is None
        out = lines(capsys)
        assert out[0] == f"[RUN] runtime_only: skipping JIT compile, using {tmp_path}"
        assert "[RUN] compile ..." not in out

    def test_missing_runtime_dir_fails(self, tmp_path):
        result = run_jit(add_kernel, specs(), runtime_dir=str(tmp_path / "nope"))
        assert not result.passed and "runtime_dir does not exist" in result.error


class TestExceptionsPropagate:
    def test_kernel_error(self, capsys):
        def kernel(x, a, y):
            raise ValueError("kernel exploded")

        with pytest.raises(ValueError, match="kernel exploded"):
            run_jit(kernel, specs(), golden_fn=add_golden)
        assert lines(capsys)[-1].startswith("[RUN] runtime done (")

    def test_golden_error(self, capsys):
        def golden_fn(values):
            raise KeyError("golden exploded")

        with pytest.raises(KeyError, match="golden exploded"):
            run_jit(add_kernel, specs(), golden_fn=golden_fn)
        assert lines(capsys)[-1].startswith("[RUN] compute golden done (")


class TestPlatforms:
    @pytest.mark.parametrize("platform", [None, "cpu", "a2a3sim", "a5sim"])
    def test_cpu_platforms_run(self, platform):
        cfg = {} if platform is None else dict(platform=platform)
        assert run_jit(add_kernel, specs(), golden_fn=add_golden, runtime_cfg=cfg).passed

    @pytest.mark.parametrize("platform, sim", [("a2a3", "a2a3sim"), ("a5", "a5sim")])
    def test_npu_platform_without_fallback_fails_clearly(self, platform, sim, capsys):
        calls = []
        result = run_jit(lambda *a: calls.append(a), specs(), runtime_cfg=dict(platform=platform))
        assert not result.passed and calls == []
        assert f"platform '{platform}' needs an Ascend NPU" in result.error
        assert f"-p {sim}" in result.error and "pypto-run" in result.error
        assert lines(capsys) == []  # on failure the script prints the error, not the harness

    def test_npu_platform_with_fallback_runs_on_cpu(self, monkeypatch, capsys):
        monkeypatch.setenv("PYPTO_RUN_CPU_FALLBACK", "1")
        assert run_jit(add_kernel, specs(), golden_fn=add_golden, runtime_cfg=dict(platform="a2a3")).passed
        out = lines(capsys)
        assert out[0] == "[RUN] platform 'a2a3' needs an Ascend NPU; running on the CPU instead (pypto-run)"

    def test_unknown_platform(self):
        result = run_jit(add_kernel, specs(), runtime_cfg=dict(platform="tpu"))
        assert not result.passed and "'tpu'" in result.error
        assert all(p in result.error for p in ("cpu", "a2a3sim", "a5sim", "a2a3", "a5"))

    def test_bench_env_is_noted_and_ignored(self, monkeypatch, capsys):
        monkeypatch.setenv("PYPTO_BENCH", "1")
        result = run_jit(add_kernel, specs(), golden_fn=add_golden)
        assert result.passed and result.bench is None
        assert any("benchmark skipped" in ln for ln in lines(capsys))


class TestGoldenData:
    def make_specs(self):
        return [TensorSpec("x", [3, 5], torch.float32, init_value=torch.randn),
                ScalarSpec("a", torch.int32, 7),
                TensorSpec("c", [5], torch.float32, init_value=torch.rand, is_output=True),
                TensorSpec("y", [3, 5], torch.float32, is_output=True)]

    @staticmethod
    def kernel(x, a, c, y):
        y[:] = x * a
        c += 1.0

    @staticmethod
    def golden_fn(values):
        values["y"][:] = values["x"] * values["a"]
        values["c"] += 1.0

    def test_save_then_replay(self, capsys, request):
        saved = run_jit(self.kernel, self.make_specs(), golden_fn=self.golden_fn, save_data=True)
        assert saved.passed and isinstance(saved.work_dir, Path)
        request.addfinalizer(lambda: shutil.rmtree(saved.work_dir, ignore_errors=True))
        assert saved.work_dir.parent == Path(tempfile.gettempdir())
        data = saved.work_dir / "data"
        assert sorted(p.name for p in (data / "in").iterdir()) == ["a.pt", "c.pt", "x.pt"]
        assert sorted(p.name for p in (data / "out").iterdir()) == ["c.pt", "y.pt"]
        x_saved = torch.load(data / "in" / "x.pt")
        capsys.readouterr()

        seen = {}

        def kernel(x, a, c, y):
            seen["x"], seen["a"] = x.clone(), a
            self.kernel(x, a, c, y)

        def must_not_run(values):
            raise AssertionError("golden_data wins over golden_fn")

        replay = run_jit(kernel, self.make_specs(), golden_fn=must_not_run, golden_data=str(data))
        assert replay.passed, replay.error
        assert torch.equal(seen["x"], x_saved) and seen["a"] == 7
        out = lines(capsys)
        assert f"[RUN]   cache hit: {data / 'in'}" in out and f"[RUN]   cache hit: {data / 'out'}" in out

    def test_replay_detects_wrong_kernel(self, tmp_path):
        saved = run_jit(self.kernel, self.make_specs(), golden_fn=self.golden_fn, save_data=True,
                        runtime_dir=str(tmp_path))
        assert saved.work_dir == tmp_path

        def wrong(x, a, c, y):
            y[:] = x

        result = run_jit(wrong, self.make_specs(), golden_data=str(saved.work_dir / "data"))
        assert not result.passed and "['c', 'y']" in result.error

    def test_missing_files_fail(self, tmp_path, capsys):
        (tmp_path / "in").mkdir()
        torch.save(torch.zeros(3, 5), tmp_path / "in" / "x.pt")
        result = run_jit(self.kernel, self.make_specs(), golden_data=str(tmp_path))
        assert not result.passed and "golden_data is missing files" in result.error
        for name in ("in/a.pt", "in/c.pt", "out/c.pt", "out/y.pt"):
            assert str(tmp_path / name) in result.error
        assert str(tmp_path / "in/x.pt") not in result.error
        assert lines(capsys)[-1].startswith("[RUN] generate inputs done (")

    def test_scalar_dtype_mismatch_fails(self, tmp_path):
        saved = run_jit(self.kernel, self.make_specs(), golden_fn=self.golden_fn, save_data=True,
                        runtime_dir=str(tmp_path))
        data = saved.work_dir / "data"
        torch.save(torch.tensor(7, dtype=torch.int64), data / "in" / "a.pt")
        result = run_jit(self.kernel, self.make_specs(), golden_data=str(data))
        assert not result.passed and "dtype mismatch" in result.error


@pl.program
class AddOneAndAHalf:
    @pl.function(type=pl.FunctionType.Opaque)
    def add(self, x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add"):
            y[:, :] = pl.add(x, 1.5)
        return y


def program_specs():
    return [TensorSpec("x", [4, 8], torch.float32, init_value=torch.randn),
            TensorSpec("y", [4, 8], torch.float32, is_output=True)]


class TestRunProgram:
    def test_run_calls_the_programs_entry(self, capsys):
        result = run(AddOneAndAHalf, program_specs(), golden_fn=lambda v: v["y"].copy_(v["x"] + 1.5),
                     runtime_cfg=dict(platform="a2a3sim"))
        assert result.passed, result.error
        assert "[RUN] compile ..." in lines(capsys)
        wrong = run(AddOneAndAHalf, program_specs(), golden_fn=lambda v: v["y"].copy_(v["x"] + 2.5))
        assert not wrong.passed   # the golden is compared with what the entry computed

    def test_run_runtime_dir_label(self, tmp_path, capsys):
        assert run(AddOneAndAHalf, program_specs(), runtime_dir=str(tmp_path)).passed
        assert lines(capsys)[0] == f"[RUN] runtime_only: skipping compile, using {tmp_path}"


class TestThreads:
    def test_each_import_sets_torch_threads_from_the_variable_or_the_cpu_count(self):
        # the module's import sets the thread count: re-imported (reload) under each setting, in a process of its
        # own so this one's threads stay as they are
        code = """if True:
            import importlib, os, torch
            import pypto_rt.golden as golden
            for raw in ("3", None, "0", "-2", "many", "1.5"):
                os.environ.pop("PYPTO_GOLDEN_NUM_THREADS", None)
                if raw is not None:
                    os.environ["PYPTO_GOLDEN_NUM_THREADS"] = raw
                try:
                    importlib.reload(golden)
                    print(raw, torch.get_num_threads())
                except Exception as e:
                    print(raw, type(e).__name__, str(e).splitlines()[0])
        """
        env = {k: v for k, v in os.environ.items() if k != "PYPTO_GOLDEN_NUM_THREADS"}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        said = dict(line.split(" ", 1) for line in done.stdout.splitlines())
        assert said["3"] == "3" and said["None"] == str(min(16, os.cpu_count()))
        for raw in ("0", "-2", "many", "1.5"):
            assert said[raw].startswith("PyptoError error: PYPTO_GOLDEN_NUM_THREADS="), said[raw]

    def test_import_sets_torch_threads(self):
        code = "import torch, pypto_rt.golden; print(torch.get_num_threads())"
        env = dict(os.environ, PYPTO_GOLDEN_NUM_THREADS="1")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "1"
        env["PYPTO_GOLDEN_NUM_THREADS"] = "zero"
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "PYPTO_GOLDEN_NUM_THREADS" in done.stderr


def test_exports():
    assert sorted(golden.__all__) == sorted([
        "TensorSpec", "ScalarSpec", "run", "run_jit", "RunResult", "validate_golden", "ratio_allclose",
        "ratio_reldiff", "mapped_pool_ratio_allclose", "topk_pair_compare", "error_distribution"])
    assert [name for name in golden.__all__ if not hasattr(golden, name)] == []
