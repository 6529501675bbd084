"""What the compiler and the host need to know about an op, declared once at its `@op` registration.

An `OpDef` is a frozen record of static facts: the names the op answers to, how its result shape follows from its
arguments, which dims it keeps independent (coalescing), whether its tensor operands combine elementwise, which
arguments are offsets / literal shapes, what it writes in place, and whether the host must wait for in-flight
tasks before running it. The InCore compiler (shapes, coalescing, access analysis) and the host executor query
this table (`opdef`, `names_where`) instead of keeping their own name lists. Filled at import, never mutated after.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable


class Shape(enum.Enum):
    """How an op's result shape follows from its arguments (for static shape inference)."""
    OTHER = "other"            # not statically known from the arguments' shapes
    SAME = "same"              # the shape of its tensor operands (the first one whose shape is known)
    FIRST = "first"            # the shape of its first argument (an accumulator or an in-place target)
    ROW_REDUCE = "row_reduce"  # [M, N] -> [M, 1]
    COL_REDUCE = "col_reduce"  # [M, N] -> [1, N]
    MATMUL = "matmul"          # [M, K] @ [K, N] -> [M, N], transposes per `a_trans` / `b_trans`
    FROM_ARG = "from_arg"      # a literal shape argument (`OpDef.shape_arg`)


# dims along which an op treats its operands independently: running it on k tiles stacked along such a dim
# computes what k runs compute (coalescing)
ANY_DIM = frozenset({0, 1})
ROWS = frozenset({0})      # e.g. row reductions: rows stay independent
COLS = frozenset({1})      # e.g. column reductions: columns stay independent
NO_DIM = frozenset()


@dataclass(frozen=True)
class OpDef:
    names: tuple[str, ...]                   # every qualified name it answers to ("add", "tensor.add", ...)
    shape: Shape = Shape.OTHER
    shape_arg: tuple[int, str] | None = None    # (position, keyword) of its literal result shape
    offset_arg: tuple[int, str] | None = None   # (position, keyword) of the offsets of the box it reads/writes
    coalesce: frozenset = NO_DIM             # dims it keeps independent (ANY_DIM / ROWS / COLS / NO_DIM)
    broadcasts: bool = False                 # tensor operands combine elementwise, broadcasting against each other
    writes: str | None = None                # the parameter holding the tensor it writes in place
    waits_on_host: bool = True               # False: views, metadata, creation; the host runs it without waiting
    is_view: bool = False                    # the result aliases the first argument's data
    reads_data: bool = False                 # reads one element into a scalar (`pl.read`)
    non_operands: frozenset = frozenset()    # keywords that are attributes, never tensor operands
    doc: str = ""                            # what `help(pl.<name>)` says (language/opdocs.py)

    def __post_init__(self):
        if (self.shape_arg is not None) != (self.shape is Shape.FROM_ARG):
            raise ValueError(f"op {self.names[0]!r}: shape FROM_ARG goes with a shape_arg and only with one")


OPDEFS: dict[str, OpDef] = {}   # qualified name -> its op's OpDef


def declare(opdef: OpDef) -> OpDef:
    for name in opdef.names:
        if name in OPDEFS:
            raise RuntimeError(f"op {name!r} declared twice")
        OPDEFS[name] = opdef
    return opdef


def opdef(qualname: str | None) -> OpDef | None:
    """The OpDef of the op registered as `qualname`, or None (not an op, or not registered)."""
    return OPDEFS.get(qualname) if qualname else None


def names_where(predicate: Callable[[OpDef], bool]) -> frozenset[str]:
    """Every qualified name whose OpDef satisfies `predicate`."""
    return frozenset(name for name, d in OPDEFS.items() if predicate(d))
