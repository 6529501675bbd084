"""The larger comparators: `mapped_pool_ratio_allclose` (paged pools) and `error_distribution` (diagnostics).

Split from `compare.py` only to keep modules short; both follow the comparator protocol described there.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .compare import Comparator, _reldiff, ratio_allclose

__all__ = ["mapped_pool_ratio_allclose", "error_distribution"]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def mapped_pool_ratio_allclose(mapping_name: str, *, mapping_shape: tuple[int, ...], block_size: int,
                               leading_rank_axis: bool = False, pool_name: str = "pool", atol: float | None = None,
                               rtol: float | None = None, max_error_ratio: float = 0.005) -> Comparator:
    """Build a comparator for a block-major paged pool (`[blocks, block_size, ...]`).

    The integer input `mapping_name` (shape `mapping_shape`) lists the physical rows
    (`block * block_size + offset`) the kernel writes; -1 marks an unused entry. Mapped rows are
    checked with `ratio_allclose(atol, rtol, max_error_ratio)`; every other row must equal the
    golden exactly. With `leading_rank_axis` the pool is `[ranks, blocks, block_size, ...]`,
    the mapping's first axis is the rank, and duplicates are checked per rank.

    Args:
        mapping_name: Input tensor holding the physical row of each written item.
        mapping_shape: Exact shape the mapping must have (positive dims).
        block_size: Rows per block (> 0).
        leading_rank_axis: The pool and mapping carry a leading rank axis.
        pool_name: Name used in messages.
        atol: As in `ratio_allclose`.
        rtol: As in `ratio_allclose`.
        max_error_ratio: As in `ratio_allclose`.

    Returns:
        The comparator.
    """
    mapping_shape = tuple(mapping_shape)
    _check_pool_arguments(mapping_shape, block_size, leading_rank_axis)
    inner = ratio_allclose(atol=atol, rtol=rtol, max_error_ratio=max_error_ratio)

    def cmp(actual: torch.Tensor, expected: torch.Tensor, **kw: Any) -> tuple[bool, str]:
        ranks = mapping_shape[0] if leading_rank_axis else 1
        err = _pool_layout_error(actual, expected, block_size, leading_rank_axis, ranks, pool_name)
        mapping = (kw.get("inputs") or {}).get(mapping_name)
        err = err or _mapping_error(mapping, mapping_name, mapping_shape)
        if err:
            return False, err
        n_rows = actual.shape[int(leading_rank_axis)] * block_size
        a_rows = actual.cpu().reshape(ranks, n_rows, -1)
        e_rows = expected.cpu().reshape(ranks, n_rows, -1)
        written, err = _written_rows(mapping.cpu().to(torch.int64).reshape(ranks, -1), n_rows, mapping_name,
                                     leading_rank_axis)
        if err:
            return False, err
        err = _stray_row_error(a_rows, e_rows, written, leading_rank_axis, pool_name, mapping_name)
        if err:
            return False, err
        if not written.any():
            return True, ""
        ok, detail = inner(a_rows[written], e_rows[written], **kw)
        return (True, "") if ok else (False, f"    mapped rows in {pool_name} from '{mapping_name}':\n{detail}")

    cmp.__name__ = (f"mapped_pool_ratio_allclose(mapping={mapping_name}, shape={mapping_shape}, "
                    f"block_size={block_size}, leading_rank_axis={leading_rank_axis}, "
                    f"atol={atol}, rtol={rtol}, max_error_ratio={max_error_ratio})")
    return cmp


def _check_pool_arguments(mapping_shape: tuple[int, ...], block_size: int, leading_rank_axis: bool) -> None:
    if not mapping_shape or any(d <= 0 for d in mapping_shape):
        raise ValueError(f"mapping_shape must contain positive dimensions, got {mapping_shape}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if leading_rank_axis and len(mapping_shape) < 2:
        raise ValueError(
            f"leading_rank_axis needs mapping_shape with a rank axis and an item axis, got {mapping_shape}")


def _stray_row_error(a_rows: torch.Tensor, e_rows: torch.Tensor, written: torch.Tensor, ranked: bool,
                     pool_name: str, mapping_name: str) -> str:
    """The first row no mapping entry names that differs from the golden (those must match exactly), or ""."""
    stray = ~written & ~(a_rows == e_rows).all(dim=-1)
    if not stray.any():
        return ""
    rank, row = stray.nonzero()[0].tolist()
    changed = int((a_rows[rank, row] != e_rows[rank, row]).count_nonzero())
    rank_txt = f" rank={rank}" if ranked else ""
    return (f"    unmapped physical {pool_name} row changed:{rank_txt} row={row} "
            f"changed_values={changed} mapping='{mapping_name}'")


def _pool_layout_error(actual: torch.Tensor, expected: torch.Tensor, block_size: int, ranked: bool, ranks: int,
                       pool_name: str) -> str:
    if actual.shape != expected.shape:
        return f"    {pool_name} shape mismatch: actual={tuple(actual.shape)} expected={tuple(expected.shape)}"
    block_axis = 2 if ranked else 1
    if actual.ndim <= block_axis or actual.shape[block_axis] != block_size:
        layout = "[ranks, blocks, block_size, ...]" if ranked else "[blocks, block_size, ...]"
        return (f"    expected block-major {pool_name} layout {layout} with block_size={block_size}, "
                f"got {tuple(actual.shape)}")
    if ranked and actual.shape[0] != ranks:
        return f"    leading rank count of {pool_name} must be {ranks}, got {actual.shape[0]}"
    return ""


def _mapping_error(mapping: torch.Tensor | None, name: str, shape: tuple[int, ...]) -> str:
    if mapping is None:
        return f"    compare_fn misconfigured: missing input '{name}'"
    if mapping.dtype not in _INT_DTYPES:
        return f"    '{name}' must have an integer dtype, got {mapping.dtype}"
    if tuple(mapping.shape) != shape:
        return f"    '{name}' must have shape {shape}, got {tuple(mapping.shape)}"
    return ""


def _written_rows(mapping: torch.Tensor, n_rows: int, name: str, ranked: bool) -> tuple[torch.Tensor, str]:
    """Mask `[ranks, n_rows]` of rows the mapping names, or an error for bad/duplicate entries."""
    def where(rank: int, item: int) -> str:
        return f"[{rank}, {item}]" if ranked else f"[{item}]"

    for mask, what in ((mapping < -1, "is invalid; only -1 is a negative sentinel"),
                       (mapping >= n_rows, f"is outside physical row range [0, {n_rows})")):
        if mask.any():
            rank, item = mask.nonzero()[0].tolist()
            value = int(mapping[rank, item])
            return torch.zeros(0, dtype=torch.bool), f"    '{name}'{where(rank, item)}={value} {what}"
    written = torch.zeros((mapping.shape[0], n_rows), dtype=torch.bool)
    for rank in range(mapping.shape[0]):
        rows = mapping[rank][mapping[rank] >= 0]
        uniq, counts = torch.unique(rows, return_counts=True)
        if (counts > 1).any():
            on_rank = f" on rank {rank}" if ranked else ""
            return written, f"    '{name}' contains duplicate physical row {int(uniq[counts > 1][0])}{on_rank}"
        written[rank, rows] = True
    return written, ""


def _percentiles(flat: torch.Tensor, quantiles: tuple[float, ...]) -> list[float]:
    """Linear-interpolated quantiles via a sort (no size limit, unlike `torch.quantile`)."""
    s = torch.sort(flat.to(torch.float64)).values
    out = []
    for q in quantiles:
        pos = q * (s.numel() - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        out.append(float(s[lo] + (s[hi] - s[lo]) * (pos - lo)))
    return out


def error_distribution(diff_thds: tuple[float, ...] = (1e-3, 3e-3, 5e-3, 1e-2, 3e-2, 5e-2),
                       quantiles: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999, 0.9999, 1.0),
                       always_pass: bool = True) -> Comparator:
    """Build a diagnostic comparator that prints where an output's error lies.

    Prints rel-L2 and cosine similarity, a `frac>thd` table using `ratio_reldiff`'s rdiff for each
    threshold, and percentiles of the relative diff, absolute diff and golden magnitude.

    Args:
        diff_thds: Thresholds for the `frac>thd` table.
        quantiles: Quantiles (in [0, 1]) for the percentile rows.
        always_pass: When False, NaN/Inf in the kernel output fails the comparison.

    Returns:
        The comparator (it passes unless `always_pass=False` and the output has NaN/Inf).
    """
    def cmp(actual: torch.Tensor, expected: torch.Tensor, **_kw: Any) -> tuple[bool, str]:
        a, e = actual.cpu().to(torch.float32), expected.cpu().to(torch.float32)
        nan, inf = int(torch.isnan(a).sum()), int(torch.isinf(a).sum())
        if nan or inf:
            msg = f"    illegal values in actual: NaN={nan} Inf={inf}"
            print(msg, flush=True)
            if not always_pass:
                return False, msg
        diff = (a - e).abs()
        rel = float(diff.norm() / e.norm().clamp_min(1e-12))
        cos = float(torch.nn.functional.cosine_similarity(a.flatten(), e.flatten(), dim=0))
        print(f"rel-L2 = {rel:.4%}  cosine = {cos:.7f}  numel={a.numel()}", flush=True)
        for thd in diff_thds:
            rdiff = _reldiff(diff, a, e, thd)
            bad = rdiff > thd
            worst = float(rdiff[bad].max()) if bad.any() else 0.0
            print(f"  diff_thd={thd:.0e}  frac>thd={float(bad.sum()) / max(a.numel(), 1):.4%}  worst={worst:.3g}")
        _print_percentiles("rel-diff percentiles", diff / torch.maximum(a.abs(), e.abs()).clamp_min(1e-6), quantiles)
        _print_percentiles("abs-diff percentiles", diff, quantiles)
        print(f"  |golden| mean={float(e.abs().mean()) if e.numel() else 0.0:.4g}")
        _print_percentiles("|golden| percentiles", e.abs(), quantiles)
        return True, ""

    cmp.__name__ = f"error_distribution(diff_thds={diff_thds})"
    return cmp


def _print_percentiles(label: str, values: torch.Tensor, quantiles: tuple[float, ...]) -> None:
    flat = values.flatten()
    flat = flat[torch.isfinite(flat)]
    if flat.numel() == 0:
        print(f"  {label}: (no finite values)", flush=True)
        return
    cells = "  ".join(f"p{q * 100:g}={v:.3g}" for q, v in zip(quantiles, _percentiles(flat, quantiles)))
    print(f"  {label}: {cells}", flush=True)
