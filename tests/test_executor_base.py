"""The executors share a small base (executor_base), not the reference executor: the oracle is nobody's base."""
from __future__ import annotations

import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt.errors import NotSupportedError
from pypto_rt.executor_base import ExecutorBase
from pypto_rt.incore_compiler.kernel_executor import KernelExecutor
from pypto_rt.orchestration.host import HostExecutor
from pypto_rt.reference.executor import ReferenceExecutor


@pytest.mark.parametrize("executor", [HostExecutor, KernelExecutor])
def test_product_executors_derive_from_the_base_not_from_the_oracle(executor):
    assert ExecutorBase in executor.__bases__
    assert not issubclass(executor, ReferenceExecutor)


def test_an_executor_must_say_how_kernel_calls_run():
    class Incomplete(ExecutorBase):
        pass

    with pytest.raises(TypeError, match="call_kernel"):
        Incomplete(None)


@pl.jit.extern
def _device_code(x: pl.Tensor[[4], pl.FP32]):
    pass


@pl.jit
def _calls_extern(x: pl.Tensor[[4], pl.FP32]):
    _device_code(x)


@pytest.mark.parametrize("executor", ["reference", "compiled"])
def test_every_executor_refuses_hand_written_device_code_the_same_way(executor):
    with config.scope(EXECUTOR=executor), pytest.raises(NotSupportedError, match="@pl.jit.extern kernel _device_code"):
        _calls_extern(torch.zeros(4))
