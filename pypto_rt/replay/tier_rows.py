"""The rows of its tensor inputs a segment of a long replay touches (replay.tier_segments): a segment cut from an
unrolled tile loop reads and writes its inputs only through slices with constant bounds on their first dimension
(`a2[8:16, :] = v19`). It is given the view of the rows it touches (`a2[8:40]`), its slices rebased to it
(`a2[0:8, :]`): the compiled graph then writes back at most those rows (a graph writing an input may write it
back whole: with the whole tensor, each segment would pass over all of it, a call's time growing with the square
of the replay's length), and segments of the same tiles on other rows are the same code.
"""
from __future__ import annotations

import ast
import copy


def rebased(statements: list, names: list) -> tuple[list, dict]:
    """(`statements` with the first-dimension slices of each of `names` that is only used so rebased to the rows it
    touches, {name: (first row, end row)} of those); the statements are copies, the others as given."""
    uses: dict = {n: [] for n in names}
    stored = {n.id for s in statements for n in ast.walk(s) if isinstance(n, ast.Name)
              and not isinstance(n.ctx, ast.Load)}
    plain = set()
    for stmt in statements:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in uses:
                bounds = _rows(node)
                if bounds is None:
                    plain.add(node.value.id)
                else:
                    uses[node.value.id].append(bounds)
    subscripted = {id(n.value) for s in statements for n in ast.walk(s) if isinstance(n, ast.Subscript)}
    for stmt in statements:   # (a name used other than as a sliced value: passed whole)
        plain |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id in uses
                  and isinstance(n.ctx, ast.Load) and id(n) not in subscripted}
    rows = {n: (min(lo for lo, _ in b), max(hi for _, hi in b)) for n, b in uses.items()
            if b and n not in plain and n not in stored}
    if not rows:
        return statements, {}
    statements = copy.deepcopy(statements)
    for stmt in statements:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in rows:
                first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
                base = rows[node.value.id][0]
                first.lower, first.upper = (ast.Constant(b.value - base) for b in (first.lower, first.upper))
    return statements, rows


def _rows(node: ast.Subscript) -> tuple[int, int] | None:
    """(start, end) of a subscript's first-dimension slice with constant non-negative bounds and no step, or None."""
    first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) and node.slice.elts else node.slice
    if not isinstance(first, ast.Slice) or first.step is not None:
        return None
    bounds = [b.value if isinstance(b, ast.Constant) and type(b.value) is int else None
              for b in (first.lower, first.upper)]
    if None in bounds or bounds[0] < 0 or bounds[1] < bounds[0]:
        return None
    return bounds[0], bounds[1]
