"""What kind of torch call the recorder sees: the name sets it classifies calls by, and small helpers over
call arguments (the tensors and traced numbers in them, a tensor's memory, the user's line)."""
from __future__ import annotations

import os
import sys

import torch

from pypto_rt.errors import is_internal_file
from pypto_rt.replay.scalars import TRACED, TracedInt

# calls whose non-tensor results are metadata: static under one specialisation (same shapes, strides, dtypes)
METADATA_TYPES = (torch.Size, torch.dtype, torch.device, torch.layout, torch.memory_format, torch.UntypedStorage)
METADATA = {"dim", "ndimension", "size", "stride", "numel", "nelement", "element_size", "storage_offset",
             "is_contiguous", "is_floating_point", "is_complex", "is_signed", "get_device", "__len__", "__hash__",
             "data_ptr", "is_shared", "is_pinned", "__get__", "is_inference", "is_neg", "is_conj", "type"}
# calls that turn tensor data into Python values
DATA_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy",
               "__array__", "__format__", "__repr__", "__str__", "equal", "allclose", "is_nonzero", "__contains__"}
# result shapes that depend on data
DATA_SHAPED = {"nonzero", "nonzero_static", "argwhere", "masked_select", "unique", "unique_consecutive",
                "bincount", "repeat_interleave", "_unique2", "histogram"}
RANDOM = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
           "multinomial", "normal", "uniform_", "normal_", "exponential_", "random_", "dropout"}
# a recording keeps every tensor the run makes alive (so ids and storages stay unique): it stops beyond this
IN_PLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                     "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"}
SIMPLE = (int, bool, str, type(None))
KEY_BOUNDS = (int, TracedInt, type(None))   # slice bounds written in subscript syntax
READABLE = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16,
             torch.float32, torch.float64}   # what read_scalar reads again (Python's .item() of them is exact)
# a storage of at most this many elements is read whole (`.tolist()`) by a replay that reads scalars from it
# calls whose result is a window of their first argument at offsets given by their other arguments
WINDOWS = {"__getitem__", "__setitem__", "narrow"}
# calls whose scalar arguments are operands, never sizes: their results are shaped by their tensors alone
SCALAR_OPERANDS = {
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "maximum", "minimum",
    "lt", "le", "gt", "ge", "eq", "ne", "clamp", "clip", "clamp_min", "clamp_max", "where", "masked_fill",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "fill", "lerp"}
# calls whose scalar arguments are the contents of the tensor they make: its shape is the arguments' nesting
CONTENTS = {"tensor", "as_tensor", "scalar_tensor", "full_like", "fill_", "fill"}
SCALAR_OPERANDS |= {n + "_" for n in SCALAR_OPERANDS} | {
    f"__{p}{n}__" for p in ("", "r", "i") for n in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift")} | {
    "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"}

GETITEM, SETITEM, COPY = torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.copy_


class Refused(Exception):
    """The run cannot be replayed; the message says why."""


_TORCH_DIR = os.path.dirname(torch.__file__)


def users_line() -> str | None:
    """`file:line` of the innermost frame of the user's code (not pypto-rt's, not torch's) on this stack."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (is_internal_file(name) or name.startswith(_TORCH_DIR) or name.startswith("<")):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def traced_of(value, out: list) -> list:
    """The traced numbers in call arguments (nested tuples, lists, sizes, slices), in order."""
    for v in value:
        kind = type(v)
        if kind in TRACED:
            out.append(v)
        elif kind is slice:
            traced_of((v.start, v.stop, v.step), out)
        elif kind is tuple or kind is list or kind is torch.Size:   # (a Size may hold a traced row count)
            traced_of(v, out)
    return out


def storage_id(t: torch.Tensor) -> int:
    """The identity of a tensor's memory (an empty one has none: its own id, negated)."""
    return t.untyped_storage().data_ptr() or -id(t)


def tensors_of(value, out: list | None = None) -> list:
    """The tensors in `value` (nested tuples, lists and dicts), in order."""
    out = [] if out is None else out
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif isinstance(v, (tuple, list, dict)):
                tensors_of(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            tensors_of(v, out)
    return out

