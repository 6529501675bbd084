"""The example kernels `make demo` runs pass their goldens through `pypto-run` (the multi-rank MoE one included)."""
from __future__ import annotations

import os

import pytest

from examples.demo import HERE, KERNELS
from tests.conftest import run_pypto


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", KERNELS)
def test_example_kernel_passes(name):
    proc = run_pypto(os.path.join(HERE, "kernels", name), "-p", "cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[RUN] PASS" in proc.stdout
