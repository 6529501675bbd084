"""Windows at offsets computed from data while a run is recorded (`t[s:s + 1, :]`, `t.narrow(0, s, 4)`): the guards
that keep them inside their tensor with the recorded extents, so only their offset varies between replays; or, for
a row count computed from a late value (`t[a:a + c]`, c read from data the run wrote, which no guard can check in
time), an in-line check of the replay whose window rows then follow c (replay.late_rows)."""
from __future__ import annotations

import torch

from pypto_rt.replay.calls import users_line
from pypto_rt.replay.late_rows import rows_inside
from pypto_rt.replay.records import Call, joined
from pypto_rt.replay.scalars import TracedInt, untraced


def guard_window(rec, t: torch.Tensor, key, traced: list) -> TracedInt | None:
    """Guard (recorder `rec`) the window `t[key]` made from `traced` numbers, or pin the values it cannot bound
    this way; the window's late row count where it has one (its bounds then an in-line check), else None."""
    key = key if isinstance(key, tuple) else (key,)
    if len(key) > t.dim() or any(not (type(k) is slice or type(k) is int or type(k) is TracedInt) for k in key):
        return rec._pin(traced)
    checks, rows = [], None
    for axis, (k, n) in enumerate(zip(key, t.shape)):
        if axis == 0 and rec.rows.of(t) is not None:
            n = rec.rows.of(t)
        if type(k) is slice:
            if k.step not in (None, 1) or any(type(b) not in (int, TracedInt, type(None)) for b in (k.start, k.stop)):
                return rec._pin(traced)
            start, stop = (0 if k.start is None else k.start), (n if k.stop is None else k.stop)
            if type(start) is TracedInt or type(stop) is TracedInt:
                a, b = untraced(start), untraced(stop)
                bounded = [(start, ">=", 0, 0 <= a), (stop, ">=", start, a <= b), (stop, "<=", n, b <= untraced(n))]
                if axis == 0 and _late(rec, stop - start) and not _late(rec, start):
                    rows = (start, stop, n, bounded)
                else:
                    checks += bounded + [(stop - start, "==", b - a, True)]   # (the extent: traced, as code)
        elif type(k) is TracedInt:
            checks += [(k, ">=", 0, 0 <= untraced(k)), (k, "<", n, untraced(k) < n)]
    if not all(check[3] for check in checks + (rows[3] if rows else [])):   # outside when recorded: pin instead
        return rec._pin(traced)
    for left, symbol, right, _ in checks:
        rec.guard(left, symbol, right, True)
    if rows is None:
        return None
    start, stop, n, _ = rows
    check = (rec._const(rows_inside, "f"), "(") + joined(
        [rec._render(start), rec._render(stop), rec._render(n), rec._render(users_line() or "?")]) + (")",)
    rec.recorded.append(Call(check, [], True, kind="check"))
    return stop - start


def _late(rec, value) -> bool:
    """Whether a number is computed from a value read from data the run computed (a guard on it comes too late)."""
    return type(value) is TracedInt and not rec._late.isdisjoint(value.symbols)
