"""Tensors whose row count follows a number the run computed: a window `t[a:a + c]` whose extent `c` is read
(`pl.read`) from data the run wrote, and what the op library makes from it.

A replay's shapes are otherwise static (replay.capture): a window's extent taken from data is guarded to stay as
recorded, and a guard on a late value (one read from computed data) comes too late, so such a window refused the
recording. Here its extent is kept as code instead, on axis 0 only:
- the window is marked with its extent (a TracedInt); its bounds become an in-line check of the replay
  (`rows_inside`), which raises where the window would leave its tensor (an engine run pads such a window; a
  replay cannot, having touched data already: DESIGN.md's semantics decisions);
- reads of its shape (`.shape`, `size()`, `numel()`) answer the traced extent, so what the op library decides on
  it becomes a guard (refused: it is late) or code, never a number baked in;
- each recorded call taking such a tensor follows an exact rule for its result's rows (`follow`): elementwise
  ops and casts, reshapes whose element count holds for every row count, `view(dtype)` of a 2-D or wider tensor,
  row gathers by a marked index, full reductions, column windows, matrix products over its rows, row scatters
  into a fixed tensor, and copies between windows of equal extents. Any other
  call refuses the recording (the block is then called as it is, as before).
Extents are equal when their codes are polynomially equal (guards.holds_always).
"""
from __future__ import annotations

import math

import torch

from pypto_rt.errors import OpError
from pypto_rt.replay.calls import SCALAR_OPERANDS, Refused, tensors_of
from pypto_rt.replay.guards import Guard, holds_always
from pypto_rt.replay.scalars import TRACED, TracedInt, untraced

# one result per element of the inputs (broadcast): the result keeps the rows of its marked inputs
ELEMENTWISE = SCALAR_OPERANDS | {
    "to", "float", "int", "long", "bool", "half", "bfloat16", "double", "type_as", "clone", "contiguous", "abs",
    "neg", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "relu", "silu", "sign", "floor",
    "ceil", "round", "trunc", "square", "logical_and", "logical_or", "logical_not", "logical_xor", "bitwise_not",
    "__invert__", "__neg__", "__abs__", "isnan", "isinf", "isfinite", "zeros_like", "ones_like", "empty_like",
    "full_like"}
FULL_REDUCTIONS = {"all", "any", "sum", "amax", "amin", "max", "min", "mean", "prod"}
RESHAPES = {"reshape", "view"}
MATMULS = {"matmul", "bmm", "mm", "__matmul__"}
_UNCHANGED = {"dim", "ndimension", "element_size", "is_floating_point", "is_complex", "is_signed", "get_device",
              "__hash__", "is_inference", "is_neg", "is_conj", "type", "ndim", "itemsize", "dtype", "device",
              "layout", "is_cuda", "is_cpu", "requires_grad"}   # static for any row count (methods, properties)


class LateRows:
    """id(tensor) -> (tensor, extent of its axis 0) for the recording `rec` (its `_int_names`)."""

    def __init__(self, rec):
        self.rec = rec
        self._of: dict[int, tuple[torch.Tensor, TracedInt]] = {}

    def __bool__(self):
        return bool(self._of)

    def of(self, t) -> TracedInt | None:
        """The traced extent of `t`'s axis 0, None when its rows are static."""
        got = self._of.get(id(t))
        return got[1] if got is not None and got[0] is t else None

    def mark(self, t: torch.Tensor, extent: TracedInt) -> None:
        if t.dim() == 0 or t.shape[0] != untraced(extent):
            raise Refused("a window whose row count follows data did not get that many rows")
        self._of[id(t)] = (t, extent)

    def same(self, a, b) -> bool:
        """Whether two extents (traced or plain) are equal for every value of what they are computed from."""
        if a is b or (type(a) is TracedInt and type(b) is TracedInt and a.code == b.code):
            return True
        if type(a) is not TracedInt or type(b) is not TracedInt:
            return False
        return holds_always(Guard.of(a, "==", b, True), self.rec._int_names)

    # -- metadata reads ---------------------------------------------------------------------------------
    def answer(self, name: str, args: tuple, out, prop: str = ""):
        """The answer to a metadata read of a marked tensor (`args[0]`): the traced extent where it is asked;
        `out` itself for what no row count changes; contiguity where it holds for any row count, or where it does
        not hold now (the general course). Refused for other reads whose answer could differ with the rows
        (strides, the place in memory, `nbytes`). `prop`: the property a `__get__` reads."""
        extent = self.of(args[0])
        if extent is None:
            return out
        t = args[0]
        if (name == "size" or prop == "shape") and isinstance(out, torch.Size):
            return torch.Size([extent, *out[1:]])
        if name == "size" and len(args) == 2 and isinstance(args[1], int):
            return extent if args[1] in (0, -t.dim()) else out   # (another axis)
        if name == "__get__":
            name = prop
        if name in ("numel", "nelement"):
            return extent * math.prod(t.shape[1:])
        if name == "is_contiguous" and len(args) == 1:
            if _contiguous_for_any_rows(t):
                return True
            if out is False:
                return False   # the general course, right for any row count (c <= 1 makes a view contiguous)
        if name in _UNCHANGED or (name != "nbytes" and not isinstance(out, (int, bool, torch.Size, tuple))):
            return out
        raise Refused(f"the run reads `{name}` of a tensor whose row count follows data it computed")

    # -- calls ----------------------------------------------------------------------------------------
    def follow(self, name: str, args: tuple, kwargs: dict, out, window: TracedInt | None) -> bool:
        """Mark `out` (a recorded call's result) where its rows follow a marked input's, or a window's extent
        (`window`: the late extent of the window this call makes, see replay.windows); Refused
        for a call on marked tensors that no rule sizes exactly. True where the call's traced arguments are sizes
        the rule accounts for (a reshape to `[c, ...]`: not to be pinned)."""
        if window is not None:
            if name == "__setitem__":
                value = args[2] if len(args) > 2 else None
                if not isinstance(value, torch.Tensor) or not self.same(self.of(value), window) \
                        or self.of(args[0]) is not None:
                    raise Refused("a subscript assignment into rows whose count follows data takes a value of "
                                  "another row count")
                return False
            if name not in ("__getitem__", "narrow") or not isinstance(out, torch.Tensor):
                raise Refused(f"`{name}` takes a window whose row count follows data")
            self.mark(out, window)
            return False
        marked = [t for t in tensors_of(args) + tensors_of(kwargs) if self.of(t) is not None]
        if not marked:
            return False
        first = marked[0]
        extent = self.of(first)
        if name == "copy_":
            return self._copied(args)
        if name == "index_copy_" and len(args) == 4 and args[1] == 0 and self.of(args[0]) is None and \
                self.of(args[2]) is not None and args[2].dim() == 1 and self.same(self.of(args[2]), self.of(args[3])):
            return False   # rows written to a fixed tensor, one per index entry
        if name == "_assert_async" or out is None:
            raise Refused(f"`{name}` takes a tensor whose row count follows data")
        if not isinstance(out, torch.Tensor):
            raise Refused(f"`{name}` makes several results from a tensor whose row count follows data")
        if name in ELEMENTWISE:
            return self._elementwise(name, args, kwargs, out, extent)
        if name in FULL_REDUCTIONS and len(args) == 1 and set(kwargs) <= {"dtype"}:
            return False   # a 0-d result
        if name in RESHAPES and args[0] is first:
            return self._reshaped(name, args, out, extent)
        if name in ("index_select", "__getitem__"):
            return self._indexed(name, args, kwargs, out, extent)
        if name in MATMULS and len(args) == 2 and not kwargs and args[0] is first:
            return self._multiplied(name, args, out, extent)
        raise Refused(f"`{name}` takes a tensor whose row count follows data, and the recording cannot size its "
                      f"result")

    def _elementwise(self, name, args, kwargs, out, extent) -> bool:
        for t in tensors_of(args) + tensors_of(kwargs):
            rows = self.of(t)
            if t.dim() < out.dim():
                if rows is not None:
                    raise Refused(f"`{name}` broadcasts a tensor whose row count follows data along another axis")
            elif rows is None and t.shape[0] != 1:
                raise Refused(f"`{name}` combines rows whose count follows data with a fixed number of rows")
            elif rows is not None and not self.same(rows, extent):
                raise Refused(f"`{name}` combines two row counts that follow data")
        if out.dim() == 0:
            raise Refused(f"`{name}` of a tensor whose row count follows data made a 0-d result")
        self.mark(out, extent)
        return False

    def _reshaped(self, name, args, out, extent) -> bool:
        t = args[0]
        if name == "view" and len(args) == 2 and isinstance(args[1], torch.dtype):
            if t.dim() >= 2 or t.element_size() == out.element_size():
                self.mark(out, extent)
                return False
            raise Refused("`view(dtype)` changes the row count of a 1-D tensor whose rows follow data")
        rest_in, rest_out = math.prod(t.shape[1:]), math.prod(out.shape[1:])
        sizes = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list, torch.Size)) else args[1:]
        first = sizes[0] if sizes else None
        # rows * rest_in elements before and after: the result's rows are `first` where that holds for every row
        # count, or, for -1, rows * (rest_in / rest_out) where that ratio is a whole number
        if out.dim() and rest_in and rest_out and not any(type(s) in TRACED for s in sizes[1:]):
            if type(first) is TracedInt and self.same(first * rest_out, extent * rest_in):
                self.mark(out, first)
                return True
            if type(first) is int and first == -1 and rest_in % rest_out == 0:
                self.mark(out, extent if rest_in == rest_out else extent * (rest_in // rest_out))
                return False
        raise Refused(f"`{name}` to {list(out.shape)} of a tensor whose row count follows data")

    def _indexed(self, name, args, kwargs, out, extent) -> bool:
        src = args[0]
        if name == "index_select":
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            index = args[2] if len(args) > 2 else kwargs.get("index")
            rows = self.of(index)
            if dim == 0 and rows is not None and index.dim() == 1 and self.of(src) is None:
                self.mark(out, rows)
                return False
            if dim not in (0, -src.dim()) and rows is None:
                self.mark(out, self.of(src))
                return False
            raise Refused("`index_select` mixes row counts that follow data")
        key = args[1] if isinstance(args[1], tuple) else (args[1],)
        rows = self.of(args[1]) if isinstance(args[1], torch.Tensor) else None
        if rows is not None and args[1].dim() == 1 and self.of(src) is None and \
                args[1].dtype in (torch.int64, torch.int32):
            self.mark(out, rows)   # `table[index]`: one row per index entry
            return False
        head = key[0] if key else slice(None)
        if self.of(src) is not None and type(head) is slice and head.step is None and head.start in (None, 0) \
                and head.stop is None and not any(isinstance(k, torch.Tensor) or k is None or k is Ellipsis
                                                  for k in key) and out.dim() == src.dim():
            self.mark(out, self.of(src))   # `t[:, a:b]`: every row, some columns
            return False
        raise Refused("a subscript of a tensor whose row count follows data picks rows the recording cannot "
                      "size")

    def _multiplied(self, name, args, out, extent) -> bool:
        a, b = args
        rows = self.of(b)
        batched = a.dim() >= 3
        fits = (rows is None and (b.dim() < a.dim() or (batched and b.dim() == a.dim() and b.shape[0] == 1))) or (
            rows is not None and batched and b.dim() == a.dim() and self.same(rows, extent))
        if not fits or out.dim() != a.dim() or a.dim() < 2:
            raise Refused(f"`{name}` multiplies rows whose count follows data along another axis")
        self.mark(out, extent)   # [c, k] @ [k, n], or batched over axis 0
        return False

    def _copied(self, args) -> bool:
        dst, src = args[0], args[-1]
        if not isinstance(src, torch.Tensor) or dst.dim() != src.dim() or not self.same(self.of(dst), self.of(src)):
            raise Refused("`copy_` copies between row counts that follow data and differ")
        return False


def _contiguous_for_any_rows(t: torch.Tensor) -> bool:
    """Whether `t` would be contiguous whatever its row count: its other axes are, and a row follows the one before
    it (torch skips the strides of axes of size 1 and calls an empty tensor contiguous)."""
    expected = 1
    for size, stride in reversed(list(zip(t.shape[1:], t.stride()[1:]))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return expected == 0 or t.stride(0) == expected


def rows_inside(start: int, stop: int, rows: int, where: str) -> None:
    """A replay's check that a window whose row count follows data stays inside its tensor (recorded at
    `where`)."""
    if not (0 <= start <= stop <= rows):
        raise OpError(f"a replayed window takes rows {start}:{stop} of a tensor with {rows} rows ({where}); its "
                      "row count follows data the call computed, and a replay cannot pad a window that leaves its "
                      "tensor as the engine does", hint="keep the window inside its tensor, or run the kernel "
                      "without replay (PYPTO_REPLAY=0)")
