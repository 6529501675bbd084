"""Every conformance kernel gives the same outputs on the compiled runtime as on the reference executor.

Bit-exact where each output element is computed by the same ops in the same order on both; within
the kernel's golden tolerance where a matmul's summation order may depend on torch's thread count
(the compiled runtime's workers run with their own thread counts).
"""
from __future__ import annotations

import glob
import inspect
import os

import pytest
import torch

from pypto_rt import config
from pypto_rt.golden.files import kernel_entry, load_kernel_file

CONFORMANCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conformance")
KERNELS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CONFORMANCE, "c0[1-7]*.py")))
# kernels whose outputs come out of a matmul: compared with their golden's tolerance
MATMUL_TOLERANCE = {"c02_matmul_bf16_bt.py": 1e-2, "c04_swiglu_inline.py": 1e-2, "c07_w8a8_swiglu.py": 1e-2}


def load(name):
    return load_kernel_file(os.path.join(CONFORMANCE, name), f"diff_{name[:-3]}")


def run_on(executor, entry, specs, inputs):
    values = {name: t.clone() if isinstance(t, torch.Tensor) else t for name, t in inputs.items()}
    with config.scope(EXECUTOR=executor):
        entry(*[values[s.name] for s in specs])
    return {s.name: values[s.name] for s in specs if getattr(s, "is_output", False)}


@pytest.mark.parametrize("name", KERNELS)
def test_compiled_matches_reference(name):
    module = load(name)
    entry = kernel_entry(module)
    params = inspect.signature(module.build_specs).parameters
    required = [p for p in params.values() if p.default is inspect.Parameter.empty]
    specs = module.build_specs(*([64] * len(required)))
    torch.manual_seed(0)
    inputs = {s.name: s.create_tensor() if hasattr(s, "create_tensor") else s.to_python() for s in specs}
    want = run_on("reference", entry, specs, inputs)
    got = run_on("compiled", entry, specs, inputs)
    assert want, "the kernel has outputs"
    for out, expected in want.items():
        tol = MATMUL_TOLERANCE.get(name)
        if tol is None:
            assert torch.equal(got[out], expected), f"{name}: output {out} differs"
        else:
            torch.testing.assert_close(got[out].float(), expected.float(), rtol=tol, atol=tol)
        assert not torch.equal(expected, inputs[out]) or name.startswith("c06"), "the kernel wrote its output"
