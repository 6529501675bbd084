"""Every conformance kernel passes through `pypto-run -p cpu` (and the NPU-sim platform name).

Launched multi-rank programs (`c*_launched.py`, run by `pypto-launch --nproc N`) are not single-rank kernels:
tests/multirank runs them under the launcher. Host-form ones (`c08_allreduce_host.py`) start their ranks
themselves and run here.
"""
from __future__ import annotations

import glob
import os

import pytest

from tests.conftest import run_pypto

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "c0*.py"))
                 if not p.endswith("_launched.py"))


@pytest.mark.parametrize("kernel", KERNELS)
def test_conformance_kernel_passes(kernel):
    proc = run_pypto(os.path.join(HERE, kernel), "-p", "cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[RUN] PASS" in proc.stdout
    assert "FAIL" not in proc.stdout


def test_sim_platform_runs_on_cpu():
    proc = run_pypto(os.path.join(HERE, "c01_masked_softmax.py"), "-p", "a2a3sim")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_broken_kernel_fails_the_golden(tmp_path):
    source = open(os.path.join(HERE, "c05_layernorm_program.py")).read()
    broken = source.replace("pl.col_expand_add(normed, beta)", "pl.col_expand_sub(normed, beta)")
    assert broken != source
    path = tmp_path / "broken.py"
    path.write_text(broken)
    proc = run_pypto(str(path), "-p", "cpu")
    assert proc.returncode == 1
    assert "'y' FAIL" in proc.stdout
