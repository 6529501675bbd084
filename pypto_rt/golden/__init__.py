"""The golden harness: run a kernel on the CPU and check its outputs against a torch reference.

Kernel-library files import it as `golden` (`pypto-run` puts this package in place under that name);
pypto-rt's own code imports `pypto_rt.golden`. Importing it sets torch's CPU thread count to
`PYPTO_GOLDEN_NUM_THREADS` (a positive int) or, when unset, `min(16, cpu count)`.
"""
from __future__ import annotations

import os

import torch

from pypto_rt import knobs


def _golden_num_threads() -> int:
    """Thread count for goldens: PYPTO_GOLDEN_NUM_THREADS, else min(16, cpu count); a bad value is a PyptoError."""
    threads = knobs.get_int(knobs.GOLDEN_NUM_THREADS, 1)
    return min(16, os.cpu_count() or 1) if threads is None else threads


torch.set_num_threads(_golden_num_threads())

from .compare import ratio_allclose, ratio_reldiff, topk_pair_compare, validate_golden  # noqa: E402
from .compare_extra import error_distribution, mapped_pool_ratio_allclose  # noqa: E402
from .runner import RunResult, run, run_jit  # noqa: E402
from .spec import ScalarSpec, TensorSpec  # noqa: E402

__all__ = [
    "TensorSpec", "ScalarSpec", "run", "run_jit", "RunResult", "validate_golden", "ratio_allclose",
    "ratio_reldiff", "mapped_pool_ratio_allclose", "topk_pair_compare", "error_distribution",
]
