"""Run a kernel against a golden: `run_jit` (for `@pl.jit` functions) and `run` (for `@pl.program` classes).

One harness run goes through these stages, each framed by `[RUN] <stage> ...` / `[RUN] <stage> done (x.xxs)`:
compile, generate inputs, compute golden, runtime, validate; then `[RUN] PASS (x.xxs)`. PYPTO_GOLDEN_REPEAT=N
repeats the last four N times (`[RUN] call i of N`), each call on fresh inputs and checked: the later calls replay
(and with PYPTO_TIER=eager run compiled code), so the steady state is checked too. Everything runs on the
CPU: the platforms `cpu`, `a2a3sim` and `a5sim` are the same; `a2a3`/`a5` need `PYPTO_RUN_CPU_FALLBACK=1`
(set by `pypto-run`). An exception raised by the compile, golden or kernel call propagates; a mismatch (or a
setup problem such as missing golden data) comes back as `RunResult(passed=False, error=...)`.

The work directory is `runtime_dir` when given, else a fresh temporary directory created only for
`save_data=True` (its path is printed and returned in `RunResult.work_dir`), else `None`.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pypto_rt import config

from .compare import validate_golden
from .spec import ScalarSpec, TensorSpec

__all__ = ["RunResult", "run", "run_jit", "CPU_PLATFORMS", "NPU_PLATFORMS"]

CPU_PLATFORMS = ("cpu", "a2a3sim", "a5sim")
NPU_PLATFORMS = ("a2a3", "a5")
_SIM_OF = {"a2a3": "a2a3sim", "a5": "a5sim"}

Spec = TensorSpec | ScalarSpec


@dataclass
class RunResult:
    """Outcome of one harness run.

    Attributes:
        passed: True when the run (and validation, if any) succeeded.
        error: What went wrong, when `passed` is False.
        execution_time: Seconds from the start of the run to its verdict.
        work_dir: The run's work directory (see the module docstring), or None.
        bench: Benchmark statistics; always None on the CPU.
    """

    passed: bool
    error: str | None = None
    execution_time: float | None = None
    work_dir: Path | None = None
    bench: Any = None

    def __str__(self) -> str:
        took = f" ({self.execution_time:.2f}s)" if self.execution_time is not None else ""
        if self.passed:
            return f"PASS{took}"
        return f"FAIL: {self.error}{took}" if self.error else f"FAIL{took}"


@contextmanager
def _stage(name: str) -> Iterator[None]:
    """Print the stage's begin line, and its done line even when the body raises."""
    print(f"[RUN] {name} ...", flush=True)
    t0 = time.time()
    try:
        yield
    finally:
        print(f"[RUN] {name} done ({time.time() - t0:.2f}s)", flush=True)


class _Failed(Exception):
    """A run that ends in a failed `RunResult` (not an exception for the caller)."""


def _platform_error(platform: Any) -> str | None:
    """Return why `platform` cannot run here (None when it can); prints the CPU-fallback notice."""
    if platform in CPU_PLATFORMS:
        return None
    if platform in NPU_PLATFORMS:
        if config.RUN_CPU_FALLBACK.on():
            print(f"[RUN] platform '{platform}' needs an Ascend NPU; running on the CPU instead (pypto-run)",
                  flush=True)
            return None
        return (f"platform '{platform}' needs an Ascend NPU, which this machine does not have; "
                f"pass `-p {_SIM_OF[platform]}` (or `cpu`) to run on the CPU, or run the script through `pypto-run`")
    accepted = ", ".join(CPU_PLATFORMS + NPU_PLATFORMS)
    return f"unknown platform {platform!r}; accepted platforms: {accepted} (the last two need an Ascend NPU)"


def _check_specs(specs: list[Spec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if not isinstance(spec, (TensorSpec, ScalarSpec)):
            raise TypeError(f"specs must hold TensorSpec/ScalarSpec objects, got {type(spec).__name__}")
        if spec.name in seen:
            raise _Failed(f"specs name {spec.name!r} more than once; each kernel parameter needs exactly one spec")
        seen.add(spec.name)


def _dummy_args(specs: list[Spec]) -> list[Any]:
    """Arguments for `fn.compile`: empty tensors of each spec's shape/dtype and the scalars' values."""
    return [s.to_python() if isinstance(s, ScalarSpec) else torch.empty(s.shape, dtype=s.dtype) for s in specs]


def _save(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, tensor in tensors.items():
        torch.save(tensor, directory / f"{name}.pt")


def _load(path: Path) -> Any:
    return torch.load(path, weights_only=True)


def _needed_files(specs: list[Spec]) -> list[Path]:
    """Files a golden-data directory must hold: `in/` for inputs, in/out initial values and scalars; `out/` for
    every output."""
    files = []
    for s in specs:
        if isinstance(s, ScalarSpec) or not s.is_pure_output:
            files.append(Path("in") / f"{s.name}.pt")
        if isinstance(s, TensorSpec) and s.is_output:
            files.append(Path("out") / f"{s.name}.pt")
    return files


def _load_scalar(data_dir: Path, spec: ScalarSpec) -> ScalarSpec:
    value = _load(data_dir / "in" / f"{spec.name}.pt")
    if not isinstance(value, torch.Tensor) or value.ndim != 0:
        raise _Failed(f"{spec.name}.pt must hold a 0-dim torch.Tensor for scalar {spec.name!r}")
    if value.dtype != spec.dtype:
        raise _Failed(f"{spec.name}.pt dtype mismatch: spec={spec.dtype} file={value.dtype}")
    return ScalarSpec(spec.name, spec.dtype, value)


class _Run:
    """State of one harness run, shared by `run_jit` and `run`."""

    def __init__(self, specs: list[Spec], golden_fn: Callable | None, golden_data: str | None, rtol: float,
                 atol: float, compare_fn: dict[str, Callable] | None, save_data: bool) -> None:
        self.specs = list(specs)
        self.tensor_specs = [s for s in self.specs if isinstance(s, TensorSpec)]
        self.golden_fn, self.rtol, self.atol = golden_fn, rtol, atol
        self.data_dir = Path(golden_data) if golden_data is not None else None
        self.compare_fn = compare_fn or {}
        self.save_data = save_data
        self.start = time.time()
        self.work_dir: Path | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self.scalars: dict[str, ScalarSpec] = {s.name: s for s in self.specs if isinstance(s, ScalarSpec)}
        self.snapshot: dict[str, torch.Tensor] = {}

    def elapsed(self) -> float:
        return time.time() - self.start

    def result(self, passed: bool, error: str | None = None) -> RunResult:
        return RunResult(passed=passed, error=error, execution_time=self.elapsed(), work_dir=self.work_dir)

    def passed(self, note: str = "") -> RunResult:
        res = self.result(True)
        print(f"[RUN] PASS ({res.execution_time:.2f}s{note})", flush=True)
        return res

    def generate_inputs(self) -> None:
        """Create (or load from `golden_data`) every tensor; snapshot the initial values the golden needs."""
        with _stage("generate inputs"):
            if self.data_dir is not None:
                self._load_inputs()
                return
            self.tensors = {s.name: s.create_tensor() for s in self.tensor_specs}
            if self.golden_fn is not None or self.save_data:
                self.snapshot = {s.name: self.tensors[s.name].clone()
                                 for s in self.tensor_specs if not s.is_pure_output}
            if self.save_data:
                _save(self.work_dir / "data" / "in", self.snapshot)
                _save(self.work_dir / "data" / "in", {s.name: s.value for s in self.scalars.values()})
                print(f"[RUN]   save_data: {self.work_dir / 'data'}", flush=True)

    def _load_inputs(self) -> None:
        missing = [str(self.data_dir / f) for f in _needed_files(self.specs) if not (self.data_dir / f).is_file()]
        if missing:
            raise _Failed(f"golden_data is missing files: {missing}")
        print(f"[RUN]   cache hit: {self.data_dir / 'in'}", flush=True)
        for s in self.tensor_specs:
            pure = s.is_pure_output
            self.tensors[s.name] = torch.zeros(s.shape, dtype=s.dtype) if pure else _load(
                self.data_dir / "in" / f"{s.name}.pt")
        self.scalars = {name: _load_scalar(self.data_dir, s) for name, s in self.scalars.items()}

    def compute_golden(self) -> dict[str, torch.Tensor]:
        """Return the expected outputs: from `golden_data/out`, or by calling `golden_fn` on fresh copies."""
        with _stage("compute golden"):
            outputs = [s for s in self.tensor_specs if s.is_output]
            if self.data_dir is not None:
                print(f"[RUN]   cache hit: {self.data_dir / 'out'}", flush=True)
                return {s.name: _load(self.data_dir / "out" / f"{s.name}.pt") for s in outputs}
            values: dict[str, Any] = {}
            for s in self.specs:
                if isinstance(s, ScalarSpec):
                    values[s.name] = self.scalars[s.name].to_python()
                elif s.is_pure_output:
                    values[s.name] = torch.zeros(s.shape, dtype=s.dtype)
                else:
                    values[s.name] = self.snapshot[s.name].clone()
            self.golden_fn(values)
            golden = {s.name: values[s.name] for s in outputs}
            if self.save_data:
                _save(self.work_dir / "data" / "out", golden)
            return golden

    def ordered_args(self) -> list[Any]:
        """Kernel arguments in spec order: the harness's own tensors, scalars as Python values."""
        return [self.scalars[s.name].to_python() if isinstance(s, ScalarSpec) else self.tensors[s.name]
                for s in self.specs]

    def validate(self, golden: dict[str, torch.Tensor]) -> None:
        """Check every output; raises `AssertionError` listing all mismatches."""
        with _stage("validate"):
            outputs = {s.name: self.tensors[s.name] for s in self.tensor_specs if s.is_output}
            inputs: dict[str, torch.Tensor] = {s.name: self.tensors[s.name]
                                               for s in self.tensor_specs if not s.is_output}
            inputs.update({name: s.value for name, s in self.scalars.items()})
            validate_golden(outputs, golden, rtol=self.rtol, atol=self.atol, compare_fn=self.compare_fn,
                            inputs=inputs)


def _harness(get_kernel: Callable[[], Callable], specs: list[Spec], golden_fn: Callable | None,
             golden_data: str | None, runtime_cfg: dict[str, Any] | None, rtol: float, atol: float,
             compare_fn: dict[str, Callable] | None, compile_only: bool, runtime_dir: str | None,
             save_data: bool, compile_label: str) -> RunResult:
    """The stages shared by `run_jit` and `run`; `get_kernel()` returns the callable to compile and run."""
    state = _Run(specs, golden_fn, golden_data, rtol, atol, compare_fn, save_data)
    runtime_cfg = dict(runtime_cfg or {})
    runtime_cfg.pop("log_level", None)
    try:
        if compile_only and runtime_dir is not None:
            raise _Failed("runtime_dir is incompatible with compile_only")
        _check_specs(state.specs)
        error = _platform_error(runtime_cfg.get("platform") or "cpu")
        if error:
            raise _Failed(error)
        kernel = _compile(state, get_kernel, runtime_dir, compile_label)
        if compile_only:
            return state.passed()
        return _execute(state, kernel)
    except _Failed as failure:
        return state.result(False, str(failure))


def _compile(state: _Run, get_kernel: Callable[[], Callable], runtime_dir: str | None, compile_label: str) -> Callable:
    """The compile stage (or the `runtime_dir` replacement for it); sets the work directory."""
    if runtime_dir is not None:
        state.work_dir = Path(runtime_dir)
        if not state.work_dir.is_dir():
            raise _Failed(f"runtime_dir does not exist: {state.work_dir}")
        print(f"[RUN] runtime_only: skipping {compile_label}, using {state.work_dir}", flush=True)
        return get_kernel()
    with _stage("compile"):
        kernel = get_kernel()
        check = getattr(kernel, "check_output_directions", None)
        if callable(check):
            check([s.name for s in state.specs if getattr(s, "is_output", False)])
        compile_fn = getattr(kernel, "compile", None)
        if callable(compile_fn):
            compile_fn(*_dummy_args(state.specs))
    return kernel


def _execute(state: _Run, kernel: Callable) -> RunResult:
    """Generate inputs, compute the golden, run the kernel and validate: PYPTO_GOLDEN_REPEAT times, each call on
    fresh inputs and checked (the later calls replay, and with PYPTO_TIER=eager run compiled code)."""
    if state.save_data and state.work_dir is None:
        state.work_dir = Path(tempfile.mkdtemp(prefix="pypto_rt_golden_"))
    calls = config.GOLDEN_REPEAT.value()
    note = ""
    for call in range(1, calls + 1):
        if calls > 1:
            print(f"[RUN] call {call} of {calls} (PYPTO_GOLDEN_REPEAT)", flush=True)
        error, note = _one_call(state, kernel, first=call == 1)
        if error is not None:
            return state.result(False, error if calls == 1 else f"call {call} of {calls}: {error}")
    return state.passed(note if calls == 1 else f", {calls} calls{note}")


def _one_call(state: _Run, kernel: Callable, first: bool) -> tuple[str | None, str]:
    """One call on fresh inputs: (why its outputs do not match the golden, or None; a note for the PASS line)."""
    state.generate_inputs()
    has_golden = state.golden_fn is not None or state.data_dir is not None
    golden = state.compute_golden() if has_golden else None
    with _stage("runtime"):
        kernel(*state.ordered_args())
    if first and config.BENCH.on():
        print("[RUN]   benchmark skipped: PYPTO_BENCH has no effect on the CPU", flush=True)
    if golden is None:
        return None, ", validation skipped: no golden_fn or golden_data"
    if not any(s.is_output for s in state.tensor_specs):
        return None, ", nothing was compared: no TensorSpec has is_output=True"
    try:
        state.validate(golden)
    except AssertionError as mismatch:
        return str(mismatch), ""
    return None, ""


def run_jit(fn: Callable, specs: list[Spec], golden_fn: Callable | None = None, golden_data: str | None = None,
            compile_cfg: dict[str, Any] | None = None, runtime_cfg: dict[str, Any] | None = None,
            rtol: float = 1e-5, atol: float = 1e-5, compare_fn: dict[str, Callable] | None = None,
            compile_only: bool = False, runtime_dir: str | None = None, save_data: bool = False) -> RunResult:
    """Compile and run a `@pl.jit` kernel on the CPU and check its outputs against a golden.

    Args:
        fn: The kernel; called as `fn(*args)` with args in spec order. If it has a callable `compile`
            attribute, `fn.compile(*dummy_args)` runs in the compile stage.
        specs: `TensorSpec`/`ScalarSpec` list in the kernel's parameter order.
        golden_fn: `golden_fn(values)` fills the output tensors of `values` (name -> tensor copy or Python
            scalar) in place; its return value is ignored.
        golden_data: Directory with `in/<name>.pt` and `out/<name>.pt` to use instead of generated inputs and
            `golden_fn`. With neither this nor `golden_fn`, validation is skipped.
        compile_cfg: `distributed_config` (a DistributedConfig) sets the devices a @pl.jit.host program spans,
            one rank process each; every other key is accepted and ignored on the CPU.
        runtime_cfg: `platform` (`cpu` by default, or `a2a3sim`, `a5sim`; `a2a3`/`a5` only through `pypto-run`);
            every other key (`device_id`, `enable_*`, `log_level`, ...) is accepted and ignored.
        rtol: Relative tolerance of the default `torch.allclose` check (and passed to comparators).
        atol: Absolute tolerance, likewise.
        compare_fn: Comparators by output name, replacing `torch.allclose` for those outputs.
        compile_only: Stop after the compile stage with a PASS.
        runtime_dir: Existing directory used as the work directory instead of compiling (no compile stage runs).
        save_data: Save inputs and golden outputs under `<work_dir>/data/{in,out}` for a later `golden_data` run.

    Returns:
        The `RunResult`; a mismatch or setup problem gives `passed=False` with `error` set.
    """
    with _distributed(compile_cfg):
        return _harness(lambda: fn, specs, golden_fn, golden_data, runtime_cfg, rtol, atol, compare_fn,
                        compile_only, runtime_dir, save_data, "JIT compile")


def _distributed(compile_cfg):
    """compile_cfg's DistributedConfig: the devices a @pl.jit.host program spans (one rank process each)."""
    dist = (compile_cfg or {}).get("distributed_config")
    ids = getattr(dist, "device_ids", None)
    return config.scope(DEVICE_IDS=",".join(str(int(d)) for d in ids)) if ids else contextlib.nullcontext()


def _program_entry(program: Any) -> Callable:
    """The entry callable of a `@pl.program` class (the language is imported only when a program runs)."""
    from pypto_rt.language.decorators import program_entry

    return program_entry(program)


def run(program: Any, specs: list[Spec], golden_fn: Callable | None = None, golden_data: str | None = None,
        compile_cfg: dict[str, Any] | None = None, runtime_cfg: dict[str, Any] | None = None,
        rtol: float = 1e-5, atol: float = 1e-5, compare_fn: dict[str, Callable] | None = None,
        compile_only: bool = False, runtime_dir: str | None = None, save_data: bool = False) -> RunResult:
    """Run a `@pl.program` class's entry function on the CPU and check its outputs against a golden.

    Args:
        program: The `@pl.program` class; its entry function is called with args in spec order.
        specs: As in `run_jit`.
        golden_fn: As in `run_jit`.
        golden_data: As in `run_jit`.
        compile_cfg: As in `run_jit`.
        runtime_cfg: As in `run_jit`.
        rtol: As in `run_jit`.
        atol: As in `run_jit`.
        compare_fn: As in `run_jit`.
        compile_only: As in `run_jit`.
        runtime_dir: As in `run_jit`.
        save_data: As in `run_jit`.

    Returns:
        The `RunResult`, as in `run_jit`.
    """
    with _distributed(compile_cfg):
        return _harness(lambda: _program_entry(program), specs, golden_fn, golden_data, runtime_cfg, rtol, atol,
                        compare_fn, compile_only, runtime_dir, save_data, "compile")
