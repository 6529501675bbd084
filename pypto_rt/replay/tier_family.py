"""Families of specialisations for the compiled tier: one graph, compiled with dynamic sizes, for the sizes of an
entry whose replays differ only in integers that follow the arguments' sizes.

A replay carries sizes as recorded Python ints (`a0[0:8, :]`, `view(v3, [8, 6, 8])`), so each specialisation (a
serving batch bucket, a MoE T) would compile its own graph. Two replays of one entry have the same *call
structure* when their code is the same but for integer literals and their tensor arguments have the same dtypes,
ranks, strides, offsets and sharing. Such replays form a family. When a second member is to be compiled, each
integer that differs between the members is fitted as `a * size + c` of one argument's size that differs (integer
a and c, the simplest fit first: the size itself, then no offset); if every one fits on every member, its body is
rewritten with those expressions of its arguments' sizes, traced with those sizes symbolic (make_fx symbolic, the
sizes marked dynamic) and compiled once. A later member whose integers equal the expressions at its own sizes
shares that graph with no compile (the tier still checks it against the member's replay on one call and times it).
The first member keeps the graph compiled for its own sizes (a graph of static sizes is at least as fast).

Each member keeps its own prologue (values read from data and the guards on them, its integers as recorded) and
its own argument match: a family shares only the compiled body. A replay whose structure differs (a tile loop
whose trip count follows the size, a guard per row) stays compiled per size: the tier's text says
`size-specialised: <why>`.
"""
from __future__ import annotations

import ast
import threading
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class Member:
    """One specialisation in a family: its integer literals (in `ast.walk` order), its arguments' sizes (flattened,
    argument by argument) and its replay's constants."""
    ints: tuple
    dims: tuple
    constants: dict


@dataclass(eq=False)
class Family:
    """Replays of one call structure. `dims`: (argument, dim) of each flattened size; `fit`: integer position ->
    (size position, a, c) once fitted; `shared`: the compiled graph its members share (replay.tier's), once one
    member's was verified; `params`: the replay's parameter names."""
    dims: tuple
    params: tuple
    members: list = field(default_factory=list)
    shapes: tuple = ()   # (name, value) of the replay's constant tuples of integers (fitted like its literals)
    fit: dict | None = None
    shared: object = None
    failed: str = ""   # why the generic graph was not built or kept (its members compile their own)

    def rewrite(self, fn: ast.FunctionDef, body: list) -> list:
        """`body` (statements of `fn`) with each fitted integer replaced by its expression of the arguments' sizes;
        a constant tuple of integers (a shape recorded as `k1`) by a tuple of them."""
        nodes = _int_nodes(fn)
        numbered = {id(node): i for i, node in enumerate(nodes)}
        at = len(nodes)
        tuples = {}   # constant name -> (position of its first integer, its values)
        for name, value in self.shapes:
            tuples[name] = (at, value)
            at += len(value)
        family = self

        class Sizes(ast.NodeTransformer):
            def visit_Constant(self, node):
                i = numbered.get(id(node))
                return node if i is None else ast.copy_location(family._expression(i, node.value), node)

            def visit_Name(self, node):
                if node.id not in tuples or not isinstance(node.ctx, ast.Load):
                    return node
                first, value = tuples[node.id]
                items = [family._expression(first + k, v) for k, v in enumerate(value)]
                return ast.copy_location(ast.Tuple(items, ast.Load()), node)
        return [Sizes().visit(s) for s in body]

    def _expression(self, i: int, value: int) -> ast.expr:
        """The integer at position `i`: its fitted expression of an argument's size, else `value` itself."""
        if i not in self.fit:
            return ast.Constant(value)
        j, a, c = self.fit[i]
        arg, d = self.dims[j]
        size: ast.expr = ast.parse(f"{self.params[arg]}.shape[{d}]", mode="eval").body
        if a != 1:
            size = ast.BinOp(ast.Constant(a), ast.Mult(), size)
        if c:
            size = ast.BinOp(size, ast.Add(), ast.Constant(c))
        return size

    def dynamic_dims(self) -> dict[int, set[int]]:
        """argument -> its dims whose sizes differ between the members (symbolic in the trace)."""
        out: dict[int, set[int]] = {}
        for j, (arg, d) in enumerate(self.dims):
            if len({m.dims[j] for m in self.members}) > 1:
                out.setdefault(arg, set()).add(d)
        return out

    def fits(self, member: Member) -> bool:
        """Whether `member`'s integers are the fitted expressions at its sizes and the rest are the family's."""
        first = self.members[0]
        for i, (v, w) in enumerate(zip(member.ints, first.ints)):
            expected = w
            if i in self.fit:
                j, a, c = self.fit[i]
                expected = a * member.dims[j] + c
            if v != expected:
                return False
        return True


class Families:
    """An entry's families (per kernel: `KernelState.tier_families`), by call structure."""

    def __init__(self):
        self.by_structure: dict = {}
        self.lock = threading.Lock()


def _int_nodes(fn: ast.AST) -> list:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Constant) and type(n.value) is int]


def _is_shape(value) -> bool:
    return isinstance(value, tuple) and bool(value) and all(type(v) is int for v in value)


def structure(source: str, constants: dict, args: list) -> tuple:
    """(call structure key, integer literals then those of the constant tuples of integers, flattened sizes,
    (argument, dim) per size, parameter names, the constant tuples of integers) of a replay's `source` called
    with `args`."""
    fn = ast.parse(source).body[0]
    nodes = _int_nodes(fn)
    shapes = tuple((name, value) for name, value in sorted(constants.items()) if _is_shape(value))
    ints = tuple(n.value for n in nodes) + tuple(v for _, value in shapes for v in value)
    for n in nodes:
        n.value = None
    groups: dict[int, int] = {}
    layout, dims, where = [], [], []
    for i, a in enumerate(args):
        if a is None:
            layout.append(None)
            continue
        group = groups.setdefault(a.untyped_storage().data_ptr(), len(groups))
        layout.append((a.dtype, a.dim(), a.stride(), a.storage_offset(), group))
        dims.extend(a.shape)
        where.extend((i, d) for d in range(a.dim()))
    key = (ast.dump(fn), tuple(layout), tuple((name, type(value), len(value)) for name, value in shapes))
    return key, ints, tuple(dims), tuple(where), tuple(a.arg for a in fn.args.args), shapes


def same_constants(a: dict, b: dict) -> str | None:
    """The name of a constant that differs between two replays' constants (tuples of integers aside: they are
    fitted), or None."""
    if a.keys() != b.keys():
        return "(their names)"
    for name, x in a.items():
        y = b[name]
        if x is y or _is_shape(x):
            continue
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y):
                continue
        elif type(x) is type(y) and x == y:   # (functions: the same one; bound methods: of the same object)
            continue
        return name
    return None


def fit(members: list) -> tuple[dict | None, str]:
    """(integer position -> (size position, a, c), or None; why not): each integer that differs between
    `members` as `a * size + c` of one size that differs, the same a and c on every member."""
    varying = [j for j in range(len(members[0].dims)) if len({m.dims[j] for m in members}) > 1]
    out = {}
    for i in range(len(members[0].ints)):
        values = [m.ints[i] for m in members]
        if len(set(values)) == 1:
            continue
        candidates = [((a != 1) + 2 * (c != 0), abs(a), abs(c), j, a, c) for j in varying
                      for a, c in [_affine(values, [m.dims[j] for m in members]) or (0, 0)] if a]
        if not candidates:
            sizes = ", ".join(str(tuple(m.dims[j] for j in varying)) for m in members)
            return None, f"a recorded integer ({', '.join(map(str, values))}) follows no argument size ({sizes})"
        *_, j, a, c = min(candidates)
        out[i] = (j, a, c)
    return out, ""


def _affine(values: list, sizes: list) -> tuple[int, int] | None:
    """(a, c) with values == a * sizes + c for every pair, integers, a != 0; else None."""
    if len(set(sizes)) < 2:
        return None
    (v0, s0), (v1, s1) = next(((values[0], sizes[0]), (v, s)) for v, s in zip(values, sizes) if s != sizes[0])
    if (v1 - v0) % (s1 - s0):
        return None
    a = (v1 - v0) // (s1 - s0)
    c = v0 - a * s0
    if a == 0 or any(v != a * s + c for v, s in zip(values, sizes)):
        return None
    return a, c


OWN, GENERIC, SHARE = "own", "generic", "share"   # what a member's build does (see `join`)


def join(families: Families | None, source: str, constants: dict, args: list) -> tuple:
    """(family or None, what this specialisation's build does, why it is size-specialised or ""): SHARE the
    family's compiled graph (its integers follow the fitted sizes), compile the GENERIC graph with dynamic sizes
    (fitted on this and the earlier members), or compile its OWN graph (the first of its structure, or no fit)."""
    if families is None:
        return None, OWN, ""
    key, ints, dims, where, params, shapes = structure(source, constants, args)
    member = Member(ints, dims, constants)
    with families.lock:
        family = families.by_structure.get(key)
        if family is None:
            family = families.by_structure[key] = Family(where, params, [member], shapes=shapes)
            others = len(families.by_structure) - 1
            return family, OWN, (f"size-specialised: its call structure differs from {others} other recorded "
                                 "size(s)'") if others else ""
        differs = same_constants(family.members[0].constants, constants)
        if differs is not None:
            return None, OWN, f"size-specialised: its replay's constant {differs} differs from another size's"
        if family.shared is not None and not family.fits(member):   # (not a member: `fits` compares with them)
            return None, OWN, "size-specialised: its integers do not follow the sizes the family's graph fitted"
        family.members = [m for m in family.members if m.dims != dims] + [member]
        if family.shared is not None:
            return family, SHARE, ""
        if family.fit is not None:   # (a generic build is under way, or failed)
            return family, OWN, family.failed and f"size-specialised: {family.failed}"
        if len(family.members) < 2:
            return family, OWN, ""
        fitted, why = fit(family.members)
        if fitted is None:
            return family, OWN, f"size-specialised: {why}"
        family.fit = fitted
        return family, GENERIC, ""
