"""Checking kernel outputs against goldens: `validate_golden` and the comparator factories.

A comparator is a callable `cmp(actual, expected, *, actual_outputs, expected_outputs, inputs,
rtol, atol) -> (ok, detail)`. `validate_golden` uses one per output named in `compare_fn`
and `torch.allclose` for every other output. All comparators here are pure torch on the CPU.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["validate_golden", "ratio_allclose", "ratio_reldiff", "topk_pair_compare", "Comparator"]

Comparator = Callable[..., tuple[bool, str]]
_DEFAULT_TOL = 1e-5


def _describe(t: torch.Tensor) -> str:
    return f"shape={tuple(t.shape)} dtype={t.dtype}"


def validate_golden(outputs: dict[str, torch.Tensor], golden: dict[str, torch.Tensor], rtol: float = _DEFAULT_TOL,
                    atol: float = _DEFAULT_TOL, compare_fn: dict[str, Comparator] | None = None,
                    inputs: dict[str, torch.Tensor] | None = None) -> None:
    """Compare every kernel output with its golden, printing one `[RUN]` line per output.

    Args:
        outputs: Kernel outputs by name, in the order to check them.
        golden: Expected tensors by name.
        rtol: Relative tolerance for `torch.allclose` (also passed to comparators).
        atol: Absolute tolerance for `torch.allclose` (also passed to comparators).
        compare_fn: Comparators by output name, used instead of `torch.allclose`.
        inputs: Non-output tensors and 0-dim scalar tensors, passed to comparators.

    Raises:
        AssertionError: One or more outputs differ; the message names them all with details.
        ValueError: An output's shape or dtype differs from its golden (default comparison).
    """
    compare_fn = compare_fn or {}
    failures: dict[str, str] = {}
    for name, actual in outputs.items():
        actual = actual.cpu()
        if name not in golden:
            failures[name] = f"  '{name}' FAIL  {_describe(actual)}\n    no golden tensor was produced for it"
            print(f"[RUN]   '{name}' FAIL  {_describe(actual)}", flush=True)
            continue
        expected = golden[name].cpu()
        if name in compare_fn:
            msg = _run_custom(name, compare_fn[name], actual, expected, outputs, golden, inputs or {}, rtol, atol)
        else:
            msg = _run_allclose(name, actual, expected, rtol, atol)
        if msg:
            failures[name] = msg
    if failures:
        raise AssertionError(f"Output(s) does not match golden: {list(failures)}\n" + "\n".join(failures.values()))


def _run_custom(name: str, cmp: Comparator, actual: torch.Tensor, expected: torch.Tensor, outputs: dict,
                golden: dict, inputs: dict, rtol: float, atol: float) -> str:
    """Apply a user comparator; return "" on pass, else the failure text."""
    label = getattr(cmp, "__name__", "custom")
    ok, detail = cmp(actual, expected, actual_outputs=outputs, expected_outputs=golden, inputs=inputs,
                     rtol=rtol, atol=atol)
    verdict = "PASS" if ok else "FAIL"
    print(f"[RUN]   '{name}' {verdict}  {_describe(actual)} ({label})", flush=True)
    return "" if ok else f"  '{name}' FAIL ({label})  {_describe(actual)}\n{detail}"


def _run_allclose(name: str, actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> str:
    """Default check: `torch.allclose` (NaN never equal); return "" on pass, else the failure text."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise ValueError(f"output {name!r}: the kernel's tensor has {_describe(actual)} "
                         f"but the golden has {_describe(expected)}")
    if torch.allclose(actual, expected, rtol=rtol, atol=atol):
        print(f"[RUN]   '{name}' PASS  {_describe(actual)}", flush=True)
        return ""
    print(f"[RUN]   '{name}' FAIL  {_describe(actual)}", flush=True)
    bad = torch.nonzero(~torch.isclose(actual, expected, rtol=rtol, atol=atol).flatten()).flatten()
    shown = bad[:20].tolist()
    flat_a, flat_e = actual.flatten(), expected.flatten()
    lines = [f"    [{i}] actual={flat_a[i].item()}, expected={flat_e[i].item()}" for i in shown]
    return (f"  '{name}' FAIL  {_describe(actual)}\n"
            f"    Mismatched elements: {bad.numel()}/{actual.numel()}  rtol={rtol} atol={atol}\n"
            f"    first {len(shown)} mismatches:\n" + "\n".join(lines))


# ----------------------------------------------------------------------------------------------------------------
# shared helpers


def _narrow_valid(actual: torch.Tensor, expected: torch.Tensor, valid_rows: int | None, valid_axis: int,
                  zero_tail: bool) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Keep the leading `valid_rows` along `valid_axis`; the error text is non-empty on a bad request or dirty tail."""
    if valid_rows is None:
        return actual, expected, ""
    length = actual.shape[valid_axis]
    if not 0 <= valid_rows <= length:
        return actual, expected, f"    valid_rows={valid_rows} out of range for axis {valid_axis} of length {length}"
    if zero_tail:
        nonzero = int(actual.narrow(valid_axis, valid_rows, length - valid_rows).count_nonzero())
        if nonzero:
            return actual, expected, f"    inactive tail contains {nonzero} nonzero values"
    return actual.narrow(valid_axis, 0, valid_rows), expected.narrow(valid_axis, 0, valid_rows), ""


def _nonfinite_detail(a: torch.Tensor, e: torch.Tensor) -> str:
    """Describe NaN/Inf on either side, or "" when both are finite."""
    counts = [int(f(t).sum()) for t in (a, e) for f in (torch.isnan, torch.isinf)]
    if not any(counts):
        return ""
    return ("    illegal values in comparison: "
            f"actual: NaN={counts[0]} Inf={counts[1]}; expected: NaN={counts[2]} Inf={counts[3]}")


def _prepare_f32(actual: torch.Tensor, expected: torch.Tensor, valid_rows: int | None, valid_axis: int,
                 zero_tail: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, str]:
    """Shape check, valid-prefix narrowing, FP32 upcast and finiteness check shared by the ratio comparators.

    Returns `(None, None, "")` when there is nothing to compare (a pass).
    """
    if actual.shape != expected.shape:
        return None, None, f"    shape mismatch: actual={tuple(actual.shape)} expected={tuple(expected.shape)}"
    actual, expected, err = _narrow_valid(actual, expected, valid_rows, valid_axis, zero_tail)
    if err or actual.numel() == 0:
        return None, None, err
    a, e = actual.cpu().to(torch.float32), expected.cpu().to(torch.float32)
    err = _nonfinite_detail(a, e)
    return (None, None, err) if err else (a, e, "")


def _point_lines(bad: torch.Tensor, max_show: int, columns: dict[str, tuple[torch.Tensor, str]]) -> list[str]:
    """One line per shown bad flat index: `[i] col=value, ...` with each column's format."""
    lines = []
    for i in torch.nonzero(bad.flatten()).flatten()[:max_show].tolist():
        cells = ", ".join(f"{label}={flat[i].item():{fmt}}" for label, (flat, fmt) in columns.items())
        lines.append(f"    [{i}] {cells}")
    return lines


# ----------------------------------------------------------------------------------------------------------------
# comparator factories


def ratio_allclose(atol: float | None = None, rtol: float | None = None, max_error_ratio: float = 0.005,
                   max_show: int = 10, valid_rows: int | None = None, valid_axis: int = 0,
                   zero_tail: bool = False) -> Comparator:
    """Build an allclose comparator that tolerates a bounded fraction of bad points.

    A point is bad when `|a - e| > atol + rtol * |e|` (in FP32). The output passes when
    `bad <= round(max_error_ratio * numel)`. Any NaN/Inf on either side fails.

    Args:
        atol: Absolute tolerance; `None` uses the harness's `atol`.
        rtol: Relative tolerance; `None` uses the harness's `rtol`.
        max_error_ratio: Allowed fraction of bad points, in [0, 1].
        max_show: Most bad points listed on failure.
        valid_rows: Compare only the first `valid_rows` entries along `valid_axis` (0 passes).
        valid_axis: Axis `valid_rows` applies to.
        zero_tail: Also require the entries past `valid_rows` to be zero.

    Returns:
        The comparator.
    """
    if not 0.0 <= max_error_ratio <= 1.0:
        raise ValueError(f"max_error_ratio must be in [0, 1], got {max_error_ratio}")

    def cmp(actual: torch.Tensor, expected: torch.Tensor, **kw: Any) -> tuple[bool, str]:
        eff_atol = kw.get("atol", _DEFAULT_TOL) if atol is None else atol
        eff_rtol = kw.get("rtol", _DEFAULT_TOL) if rtol is None else rtol
        a, e, err = _prepare_f32(actual, expected, valid_rows, valid_axis, zero_tail)
        if a is None:
            return not err, err
        diff, tol = (a - e).abs(), eff_atol + eff_rtol * e.abs()
        bad = diff > tol
        count, numel, allowed = int(bad.sum()), a.numel(), round(max_error_ratio * a.numel())
        if count <= allowed:
            return True, ""
        worst = int(diff.flatten().argmax())
        where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), a.shape))
        lines = _point_lines(bad, max_show, {"actual": (a.flatten(), ".8g"), "expected": (e.flatten(), ".8g"),
                                             "diff": (diff.flatten(), ".4g"), "tol": (tol.flatten(), ".4g")})
        return False, (f"    ratio_allclose fail: error_count={count}/{numel} (ratio={count / numel:.4%}, "
                       f"allowed<={max_error_ratio:.4%}, threshold={allowed} pts)\n"
                       f"    atol={eff_atol} rtol={eff_rtol}\n"
                       f"    max abs diff={diff.flatten()[worst].item():.6g} at {where} "
                       f"(tol={tol.flatten()[worst].item():.6g})\n"
                       f"    first {len(lines)} mismatches:\n" + "\n".join(lines))

    cmp.__name__ = (f"ratio_allclose(atol={atol}, rtol={rtol}, max_error_ratio={max_error_ratio}, "
                    f"valid_rows={valid_rows}, valid_axis={valid_axis}, zero_tail={zero_tail})")
    return cmp


def _reldiff(diff: torch.Tensor, a: torch.Tensor, e: torch.Tensor, diff_thd: float) -> torch.Tensor:
    """Absolute diff where it is below `diff_thd`, else diff over max(|a|, |e|, 2^-14 / diff_thd) + 1e-9."""
    denom = torch.maximum(a.abs(), e.abs()).clamp_min(2.0 ** -14 / diff_thd) + 1e-9
    return torch.where(diff < diff_thd, diff, diff / denom)


def ratio_reldiff(diff_thd: float = 0.01, pct_thd: float = 0.05, max_diff_hd: float = float("inf"),
                  max_show: int = 10, valid_rows: int | None = None, valid_axis: int = 0,
                  zero_tail: bool = False) -> Comparator:
    """Build a relative-difference comparator with a bad-point budget and a worst-point cap.

    `rdiff = |a - e|` where that is below `diff_thd`, else `|a - e| / (max(|a|, |e|, 2^-14 / diff_thd) + 1e-9)`.
    Passes when `count(rdiff > diff_thd) <= round(pct_thd * numel)` and the worst bad `rdiff < max_diff_hd`.
    Any NaN/Inf on either side fails.

    Args:
        diff_thd: Per-point threshold (> 0).
        pct_thd: Allowed fraction of bad points, in [0, 1].
        max_diff_hd: Cap on the worst bad point's rdiff (> 0).
        max_show: Most bad points listed on failure.
        valid_rows: As in `ratio_allclose`.
        valid_axis: As in `ratio_allclose`.
        zero_tail: As in `ratio_allclose`.

    Returns:
        The comparator.
    """
    if not diff_thd > 0.0:
        raise ValueError(f"diff_thd must be > 0, got {diff_thd}")
    if not 0.0 <= pct_thd <= 1.0:
        raise ValueError(f"pct_thd must be in [0, 1], got {pct_thd}")
    if not max_diff_hd > 0.0:
        raise ValueError(f"max_diff_hd must be > 0, got {max_diff_hd}")

    def cmp(actual: torch.Tensor, expected: torch.Tensor, **_kw: Any) -> tuple[bool, str]:
        a, e, err = _prepare_f32(actual, expected, valid_rows, valid_axis, zero_tail)
        if a is None:
            return not err, err
        diff = (a - e).abs()
        rdiff = _reldiff(diff, a, e, diff_thd)
        bad = rdiff > diff_thd
        count, numel, allowed = int(bad.sum()), a.numel(), round(pct_thd * a.numel())
        worst = float(rdiff[bad].max()) if count else 0.0
        if count <= allowed and worst < max_diff_hd:
            return True, ""
        reasons = []
        if count > allowed:
            reasons.append(f"error_count={count}/{numel} (ratio={count / numel:.4%}, allowed<={pct_thd:.4%}, "
                           f"threshold={allowed} pts)")
        if worst >= max_diff_hd:
            reasons.append(f"worst rdiff={worst:.4g} >= max_diff_hd={max_diff_hd:.4g}")
        lines = _point_lines(bad, max_show, {"actual": (a.flatten(), ".8g"), "expected": (e.flatten(), ".8g"),
                                             "abs_diff": (diff.flatten(), ".4g"), "rdiff": (rdiff.flatten(), ".4g")})
        return False, (f"    ratio_reldiff fail: {' AND '.join(reasons)}\n"
                       f"    diff_thd={diff_thd} pct_thd={pct_thd} max_diff_hd={max_diff_hd}\n"
                       f"    first {len(lines)} mismatches:\n" + "\n".join(lines))

    cmp.__name__ = (f"ratio_reldiff(diff_thd={diff_thd}, pct_thd={pct_thd}, max_diff_hd={max_diff_hd}, "
                    f"valid_rows={valid_rows}, valid_axis={valid_axis}, zero_tail={zero_tail})")
    return cmp


def topk_pair_compare(vals_name: str, *, dim: int = -1, descending: bool = True, max_show: int = 10) -> Comparator:
    """Build a comparator for top-k index outputs that accepts swaps between tied scores.

    Where the kernel's index differs from the golden's, the position is accepted iff the kernel's
    own paired values (`actual_outputs[vals_name]`) stay ordered (>= for descending, <= for
    ascending) with both neighbours along `dim`. The values themselves are checked separately.

    Args:
        vals_name: Output holding the scores paired with the indices.
        dim: Axis along which the top-k is sorted.
        descending: Expected order of the values along `dim`.
        max_show: Most rejected positions listed on failure.

    Returns:
        The comparator.
    """
    def cmp(actual: torch.Tensor, expected: torch.Tensor, **kw: Any) -> tuple[bool, str]:
        outputs = kw.get("actual_outputs") or {}
        if vals_name not in outputs:
            return False, f"    compare_fn misconfigured: vals_name='{vals_name}' not found in outputs={list(outputs)}"
        vals = outputs[vals_name].cpu().to(torch.float32)
        if actual.shape != expected.shape or actual.shape != vals.shape:
            return False, (f"    shape mismatch: idx={tuple(actual.shape)} expected idx={tuple(expected.shape)} "
                           f"vals={tuple(vals.shape)}")
        if not -actual.ndim <= dim < actual.ndim:
            return False, f"    dim={dim} out of range for shape {tuple(actual.shape)}"
        axis = dim % actual.ndim
        a_idx, e_idx, v = (t.movedim(axis, -1) for t in (actual.cpu(), expected.cpu(), vals))
        rejected = (a_idx != e_idx) & ~_ordered_with_neighbours(v, descending)
        if not rejected.any():
            return True, ""
        order = "descending" if descending else "ascending"
        hits = rejected.nonzero().tolist()
        lines = [f"    top-k idx mismatch via '{vals_name}' (dim={dim} order={order}): "
                 f"{len(hits)} position(s) where a_vals breaks {order} order at the mismatch"]
        for moved in hits[:max_show]:
            lines.append(_topk_line(moved, axis, a_idx, e_idx, v))
        if len(hits) > max_show:
            lines.append(f"      ... and {len(hits) - max_show} more")
        return False, "\n".join(lines)

    cmp.__name__ = "topk_pair_compare"
    return cmp


def _ordered_with_neighbours(v: torch.Tensor, descending: bool) -> torch.Tensor:
    """Per position along the last axis: True when ordered with its left and right neighbours."""
    ok = torch.ones(v.shape, dtype=torch.bool)
    if v.shape[-1] < 2:
        return ok
    pair = v[..., :-1] >= v[..., 1:] if descending else v[..., :-1] <= v[..., 1:]
    ok[..., 1:] &= pair
    ok[..., :-1] &= pair
    return ok


def _topk_line(moved: list[int], axis: int, a_idx: torch.Tensor, e_idx: torch.Tensor, v: torch.Tensor) -> str:
    """Describe one rejected position (`moved` indexes the tensors with the top-k axis moved last)."""
    *lead, pos = moved
    coord = lead[:axis] + [pos] + lead[axis:]
    lo, hi = max(0, pos - 1), min(v.shape[-1], pos + 2)
    window = ", ".join(f"{x:.6g}" for x in v[tuple(lead)][lo:hi].tolist())
    return (f"      [{','.join(map(str, coord))}] actual_idx={int(a_idx[tuple(moved)])} "
            f"expected_idx={int(e_idx[tuple(moved)])} actual_score={float(v[tuple(moved)]):.6g} "
            f"actual_vals[{lo}:{hi}]=[{window}]")
