"""The harness driving a real kernel: NPU platforms without pypto-run fail with one clear sentence."""
from __future__ import annotations

import torch

import pypto.language as pl
from pypto_rt.golden import TensorSpec, run_jit


@pl.jit
def double(x: pl.Tensor[[4, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="double"):
        y[:, :] = pl.mul(x, 2.0)
    return y


def _specs():
    return [TensorSpec("x", [4, 4], torch.float32, init_value=torch.randn),
            TensorSpec("y", [4, 4], torch.float32, is_output=True)]


def _golden(v):
    v["y"][:] = v["x"] * 2.0


def test_npu_platform_without_fallback_fails_clearly(monkeypatch):
    monkeypatch.delenv("PYPTO_RUN_CPU_FALLBACK", raising=False)
    result = run_jit(fn=double, specs=_specs(), golden_fn=_golden, runtime_cfg=dict(platform="a2a3"))
    assert not result.passed
    assert "Ascend NPU" in result.error and "a2a3sim" in result.error


def test_sim_platform_runs_the_kernel():
    result = run_jit(fn=double, specs=_specs(), golden_fn=_golden, runtime_cfg=dict(platform="a5sim"))
    assert result.passed, result.error
