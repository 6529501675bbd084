"""Coalescing: the iterations of a tiled loop around an InCore region become a few wide tasks.

    for r in pl.parallel(0, ROWS, ROW_TILE):          for r, __extent in __rt.chunks(0, ROWS, ROW_TILE, ...):
        with pl.at(...):                        ->        submit(kernel with ROW_TILE -> __extent, r, __extent)
            t = x[r : r + ROW_TILE, :] ...

When the loop variable is used only as the offset of `ROW_TILE`-sized tiles along one dimension, and
every op in the body treats that dimension independently (elementwise ops, reductions and
broadcasts along the other dimension, matmuls whose tiled operand is on the tiled side), running
the body once on `k * ROW_TILE` rows computes exactly what `k` iterations compute. The host splits
the iteration space into one chunk per worker, more when a chunk would span more than
PYPTO_COALESCE_CHUNK_MB of tile data (`chunks.chunk_count`); with `__extent = ROW_TILE` the kernel is the original
region, so the host can always fall back to one task per iteration.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from pypto_rt.frontend.names import loaded_names, stored_names
from pypto_rt.frontend.resolve import UNRESOLVED, Env, callee, is_loop, op_name
from pypto_rt.incore_compiler.pycode import clone
from pypto_rt.incore_compiler.independence import TiledDimCheck
from pypto_rt.incore_compiler.shapes import base_op

EXTENT = "__extent"
OFFSET = "__offset"
WIDE_OFFSET, WIDTH = "__w0", "__w"   # one piece of a merged tile loop (merge_tile_loops)

@dataclass
class Coalescing:
    loop: ast.For          # the host statement whose iterations merge (a loop, or the spmd region itself)
    var: str               # the tile offset along `dim` inside the kernel
    bounds: list           # (start, stop, step) expressions of the offsets, evaluated on the host
    step: ast.expr         # the tile extent along `dim`
    dim: int
    independent: bool      # pl.parallel / pl.spmd (iterations declared independent) vs pl.range
    body: list             # the region's body with the offset written as `var` (before the extent substitution)
    new_offset: bool = False      # `var` is a new kernel input (not a name of the user's host code)
    dropped: str | None = None    # an input the coalesced kernel no longer takes (a unit-step loop index)
    untiled: tuple[str, ...] = () # inputs meeting tiled values in broadcasting ops: merged only at extent 1


def plan_coalescing(env: Env, region, loop) -> Coalescing | None:
    """How `region` (the only statement of `loop`, or an spmd region) coalesces, or None when it runs as is."""
    if region.results:
        return None
    if region.kind == "spmd":
        return _plan_spmd(env, region) or _plan_spmd_grid(env, region)
    if not isinstance(loop, ast.For) or loop.body != [region.stmt] or loop.orelse or region.kind != "at":
        return None
    it = loop.iter
    kind = callee(env, it) if isinstance(it, ast.Call) else UNRESOLVED
    if not is_loop(kind) or it.keywords or not 1 <= len(it.args) <= 3 or not isinstance(loop.target, ast.Name):
        return None
    independent = kind.__name__ == "parallel"
    var = loop.target.id
    step = it.args[2] if len(it.args) == 3 else ast.Constant(1)
    if isinstance(step, (ast.Name, ast.Attribute)):    # for r in pl.X(a, b, TILE): x[r : r + TILE]
        found = _accepting_dim(env, var, step, region.body)
        return None if found is None else Coalescing(loop, var, list(it.args), step, found[0], independent,
                                                     region.body, untiled=found[1])
    if isinstance(step, ast.Constant) and step.value == 1:   # for i in pl.X(n): x[i * TILE : (i + 1) * TILE]
        return _plan_scaled_index(env, region, loop, var, independent)
    return None


def _accepting_dim(env: Env, var: str, step, body) -> tuple[int, tuple[str, ...]] | None:
    """(the dim the body coalesces along, the inputs the host must find of extent 1 there), or None."""
    for dim in (0, 1):
        checker = TiledDimCheck(env, var, step, dim, body)
        if checker.accepts(body):
            return dim, tuple(sorted(checker.untiled))
    return None


def _plan_scaled_index(env: Env, region, loop, index: str, independent: bool) -> Coalescing | None:
    """A unit-step index used only as `index * TILE` and `(index + 1) * TILE`: offsets 0, TILE, 2 TILE, ..."""
    scales = {ast.dump(n.right): n.right for n in ast.walk(ast.Module(body=region.body, type_ignores=[]))
              if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and _is_name(n.left, index)}
    if len(scales) != 1:
        return None
    (step,) = scales.values()
    if not isinstance(step, (ast.Name, ast.Attribute)):
        return None
    body = _ScaledIndex(index, step).rewrite(region.body)
    if body is None:
        return None
    found = _accepting_dim(env, OFFSET, step, body)
    if found is None:
        return None
    args = loop.iter.args
    start, stop = (ast.Constant(0), args[0]) if len(args) == 1 else (args[0], args[1])
    bounds = [ast.BinOp(clone(start), ast.Mult(), clone(step)), ast.BinOp(clone(stop), ast.Mult(), clone(step)),
              clone(step)]
    return Coalescing(loop, OFFSET, bounds, step, found[0], independent, body, new_offset=True, dropped=index,
                      untiled=found[1])


class _ScaledIndex(ast.NodeTransformer):
    """`i * T` -> `__offset`, `(i + 1) * T` -> `__offset + T`; None when `i` is used any other way."""

    def __init__(self, index: str, step):
        self.index, self.step = index, ast.dump(step)

    def rewrite(self, body):
        out = [ast.fix_missing_locations(self.visit(s)) for s in clone(body)]
        module = ast.Module(body=out, type_ignores=[])
        return None if any(_is_name(n, self.index) for n in ast.walk(module)) else out

    def visit_BinOp(self, node):
        if isinstance(node.op, ast.Mult) and ast.dump(node.right) == self.step:
            left = node.left
            if _is_name(left, self.index):
                return ast.copy_location(ast.Name(OFFSET, ast.Load()), node)
            if (isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add) and _is_name(left.left, self.index)
                    and isinstance(left.right, ast.Constant) and left.right.value == 1):
                return ast.copy_location(ast.BinOp(ast.Name(OFFSET, ast.Load()), ast.Add(), clone(node.right)),
                                         node)
        return self.generic_visit(node)


def _is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _plan_spmd(env: Env, region) -> Coalescing | None:
    """`for b in pl.spmd(n): t0 = b * STEP; <body using t0 as a STEP-tile offset>` -> offsets 0, STEP, ..."""
    call, body = region.call, region.body
    if not region.block_var or not body or not call.args or any(k.arg != "name_hint" for k in call.keywords):
        return None
    scaled = _scaled_offset(body[0], region.block_var)
    if scaled is None or region.block_var in loaded_names(body[1:]):
        return None
    var, step = scaled
    stop = ast.BinOp(clone(call.args[0]), ast.Mult(), clone(step))
    found = _accepting_dim(env, var, step, body[1:])
    if found is None:
        return None
    return Coalescing(region.stmt, var, [ast.Constant(0), stop, clone(step)], step, found[0], True, body[1:],
                      new_offset=True, untiled=found[1])


def _scaled_offset(stmt, index: str):
    """`v = index * STEP` (or `STEP * index`), STEP a name or attribute -> (v, STEP); else None."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Mult)):
        return None
    left, right = stmt.value.left, stmt.value.right
    step = right if _is_name(left, index) else left if _is_name(right, index) else None
    return (stmt.targets[0].id, step) if isinstance(step, (ast.Name, ast.Attribute)) else None


def _plan_spmd_grid(env: Env, region) -> Coalescing | None:
    """A 2-D block grid: `for b in pl.spmd(R * C): t0 = (b // C) * S0; c0 = (b % C) * S1; <body>`, where the body
    uses t0/S0 as row-tile offsets/extents and c0/S1 as column-tile ones, every op keeping both dims independent.
    Its columns merge whole: the kernel runs `c0 = 0` over `C * S1` columns, and its rows coalesce like a 1-D
    spmd's (t0 from 0 in steps of S0, R steps)."""
    call, body = region.call, region.body
    if (not region.block_var or len(body) < 3 or len(call.args) != 1
            or any(k.arg != "name_hint" for k in call.keywords)):
        return None
    block = region.block_var
    rows = _grid_offset(body[0], block, ast.FloorDiv)
    cols = _grid_offset(body[1], block, ast.Mod)
    count = call.args[0]
    if rows is None or cols is None or block in loaded_names(body[2:]):
        return None
    (t0, per_row, s0), (c0, per_row_again, s1) = rows, cols
    if (ast.dump(per_row) != ast.dump(per_row_again) or not isinstance(count, ast.BinOp)
            or not isinstance(count.op, ast.Mult) or ast.dump(count.right) != ast.dump(per_row)
            or t0 == c0 or ast.dump(s0) == ast.dump(s1)):
        return None
    rest = body[2:]
    columns, rows = TiledDimCheck(env, c0, s1, 1, rest), TiledDimCheck(env, t0, s0, 0, rest)
    if not (columns.accepts(rest) and rows.accepts(rest)) or columns.untiled:   # columns always merge: no fallback
        return None
    width = ast.BinOp(clone(per_row), ast.Mult(), clone(s1))
    merged = _WholeColumns(c0, s1, width).rewrite(rest)
    stop = ast.BinOp(clone(count.left), ast.Mult(), clone(s0))
    return Coalescing(region.stmt, t0, [ast.Constant(0), stop, clone(s0)], s0, 0, True, merged, new_offset=True,
                      untiled=tuple(sorted(rows.untiled)))


def _grid_offset(stmt, block: str, op: type):
    """`v = (block <op> C) * S` -> (v, C, S), with S a name or attribute; else None."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Mult)):
        return None
    index, step = stmt.value.left, stmt.value.right
    if not (isinstance(index, ast.BinOp) and isinstance(index.op, op) and _is_name(index.left, block)
            and isinstance(step, (ast.Name, ast.Attribute))):
        return None
    return stmt.targets[0].id, index.right, step


class _WholeColumns(ast.NodeTransformer):
    """Column offset `c0` -> 0 (or `offset`) and column extent `S1` -> `C * S1` (or `width`): one kernel covering
    every column block (or `width` of them)."""

    def __init__(self, var: str, step, width, offset=None):
        self.var, self.step, self.width, self.offset = var, ast.dump(step), width, offset

    def rewrite(self, body):
        return [ast.fix_missing_locations(self.visit(s)) for s in clone(body)]

    def visit(self, node):
        if isinstance(node, ast.Name) and node.id == self.var and isinstance(node.ctx, ast.Load):
            return ast.copy_location(clone(self.offset) if self.offset else ast.Constant(0), node)
        if isinstance(node, ast.expr) and ast.dump(node) == self.step:
            return ast.copy_location(clone(self.width), node)
        return super().visit(node)


def merge_tile_loops(env: Env, body: list) -> list:
    """Tile loops inside a kernel body that carry nothing between iterations run as one wide pass.

        for hb in pl.range(N):                      if N > 0 and __disjoint((x, ...), (y,)):
            h0 = hb * H                                 for __w0, __w in __wide_chunks(N, H, (x, ..., y)):
            <body: H-wide tiles at h0>        ->            <body with h0 -> __w0, H -> __w>
                                                    else:
                                                        for hb in pl.range(N): ... (as written)

    `__wide_chunks` gives one pass over all N * H, or several when the tensors the body touches hold more than
    PYPTO_COALESCE_CHUNK_MB (a wide pass's temporaries are as wide as the pass).

    The body must use `h0`/`H` only as tile offsets/extents along one dimension, keep that dimension
    independent (the coalescing checker's rules), bind no name another iteration or the code after the loop
    reads, and read no tensor it writes. Each element is then computed by the same ops from the same inputs, so
    the results are identical. `__disjoint` checks at run time that no tensor it reads overlaps one it writes
    other than as the same view (a shifted alias would see earlier iterations' writes)."""
    out = []
    for i, stmt in enumerate(body):
        merged = _merged_loop(env, stmt, body, body[i + 1:]) if isinstance(stmt, ast.For) else None
        out.append(merged if merged is not None else stmt)
    return out


def _merged_loop(env: Env, loop: ast.For, kernel_body: list, after: list):
    it = loop.iter
    kind = callee(env, it) if isinstance(it, ast.Call) else UNRESOLVED
    if (not is_loop(kind) or it.keywords or len(it.args) != 1 or loop.orelse or not isinstance(loop.target, ast.Name)
            or len(loop.body) < 2):
        return None
    index, count = loop.target.id, it.args[0]
    scaled = _scaled_offset(loop.body[0], index)
    if scaled is None:
        return None
    (var, step), rest = scaled, loop.body[1:]
    if not all(isinstance(st, (ast.Assign, ast.Expr)) for st in rest) or index in loaded_names(rest):
        return None
    bound = stored_names(rest) | {var, index}
    if bound & loaded_names(after) or var in stored_names(rest) or _carries(rest):
        return None
    written = _written_bases(env, rest)
    if not written or written & _read_bases(rest, written):
        return None
    for dim in (1, 0):
        checker = TiledDimCheck(env, var, step, dim, rest, context=kernel_body)
        if checker.accepts(rest) and not checker.untiled:
            break
    else:
        return None
    wide = _WholeColumns(var, step, ast.Name(WIDTH, ast.Load()), ast.Name(WIDE_OFFSET, ast.Load())).rewrite(rest)
    reads = sorted(loaded_names(rest) - stored_names(rest) - written - {var})
    tensors = [ast.Name(n, ast.Load()) for n in reads if env.lookup(n) is UNRESOLVED]
    writes = [ast.Name(n, ast.Load()) for n in sorted(written)]
    test = ast.BoolOp(ast.And(), [
        ast.Compare(clone(count), [ast.Gt()], [ast.Constant(0)]),
        ast.Call(ast.Name("__disjoint", ast.Load()), [ast.Tuple(tensors, ast.Load()), ast.Tuple(writes, ast.Load())],
                 [])])
    pieces = ast.For(ast.Tuple([ast.Name(WIDE_OFFSET, ast.Store()), ast.Name(WIDTH, ast.Store())], ast.Store()),
                     ast.Call(ast.Name("__wide_chunks", ast.Load()), [clone(count), clone(step), ast.Tuple(
                         [clone(t) for t in tensors + writes], ast.Load())], []), wide, [])
    merged = ast.If(test, [pieces], [loop])
    for node in ast.walk(merged):
        if "lineno" in node._attributes and not hasattr(node, "lineno"):
            ast.copy_location(node, loop)
    return ast.fix_missing_locations(merged)


def _carries(body) -> bool:
    """Whether a statement reads a name the body binds before the body (re)binds it: state carried between
    iterations."""
    bound, seen = stored_names(body), set()
    for st in body:
        value = st.value
        if (loaded_names([value]) | _target_loads(st)) & (bound - seen):
            return True
        seen |= stored_names(st.targets) if isinstance(st, ast.Assign) else set()
    return False


def _target_loads(st) -> set[str]:
    return loaded_names(st.targets) if isinstance(st, ast.Assign) else set()


def _written_bases(env: Env, body) -> set[str]:
    """Names of the tensors the body writes: subscript-assignment targets and in-place ops' targets."""
    out = set()
    for st in body:
        if isinstance(st, ast.Assign):
            for t in st.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                    out.add(t.value.id)
        for node in ast.walk(st):
            if isinstance(node, ast.Call) and base_op(op_name(callee(env, node))) in ("assemble", "store", "write"):
                target = node.args[0] if node.args else None
                if not isinstance(target, ast.Name):
                    out.add("?")   # a target we cannot name: treat as read too (never merged)
                else:
                    out.add(target.id)
    return out


def _read_bases(body, written: set[str]) -> set[str]:
    """Names the body loads other than as the tensor a write goes to."""
    targets = set()
    for st in body:
        if isinstance(st, ast.Assign):
            targets |= {id(t.value) for t in st.targets if isinstance(t, ast.Subscript)}
        for node in ast.walk(st):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in written:
                targets.add(id(node.args[0]))
    names = set()
    for st in body:
        for node in ast.walk(st):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in targets:
                names.add(node.id)
    return names | ({"?"} if "?" in written else set())


def coalesced_body(coalescing: Coalescing):
    """The coalesced kernel's body: every use of the tile extent replaced by the `__extent` parameter."""
    body = coalescing.body
    step = ast.dump(coalescing.step)

    class Replace(ast.NodeTransformer):
        def visit(self, node):
            if isinstance(node, ast.expr) and ast.dump(node) == step:
                return ast.copy_location(ast.Name(EXTENT, ast.Load()), node)
            return super().visit(node)

    return [Replace().visit(s) for s in clone(body)]
