"""The golden harness: run a kernel on the CPU and check its outputs against a torch reference.

Kernel-library files import it as `golden` (`pypto-run` puts this package in place under that name);
pypto-rt's own code imports `pypto_rt.golden`. Importing it sets torch's CPU thread count to
`PYPTO_GOLDEN_NUM_THREADS` (a positive int) or, when unset, `min(16, cpu count)`.
"""
from __future__ import annotations

import os

import torch

_THREADS_ENV = "PYPTO_GOLDEN_NUM_THREADS"


def _golden_num_threads() -> int:
    """Thread count for goldens: the env override, else min(16, cpu count). Raises ValueError on a bad override."""
    raw = os.environ.get(_THREADS_ENV)
    if raw is None or not raw.strip():
        return min(16, os.cpu_count() or 1)
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads <= 0:
        raise ValueError(f"{_THREADS_ENV} must be a positive integer, got {raw!r}")
    return threads


torch.set_num_threads(_golden_num_threads())

from .compare import ratio_allclose, ratio_reldiff, topk_pair_compare, validate_golden  # noqa: E402
from .compare_extra import error_distribution, mapped_pool_ratio_allclose  # noqa: E402
from .runner import RunResult, run, run_jit  # noqa: E402
from .spec import ScalarSpec, TensorSpec  # noqa: E402

__all__ = [
    "TensorSpec", "ScalarSpec", "run", "run_jit", "RunResult", "validate_golden", "ratio_allclose",
    "ratio_reldiff", "mapped_pool_ratio_allclose", "topk_pair_compare", "error_distribution",
]
