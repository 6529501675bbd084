"""The `pl` user surface (`import pypto.language as pl`): dtypes, annotations, decorators, scopes, ops.

Nothing here runs a kernel or builds IR: ops, loops and scopes forward to the active
executor (see `_runtime`). An attribute the surface does not define raises UnknownOpError.
"""
from __future__ import annotations

from pypto_rt.errors import UnknownOpError, user_span
from pypto_rt.language import surface as _surface
from pypto_rt.language.decorators import KernelFunction, function, inline, jit, program
from pypto_rt.language.dtypes import (
    BF16, BOOL, DEFAULT_CONST_FLOAT, DEFAULT_CONST_INT, FP4, FP8E4M3FN, FP8E5M2, FP8E8M0, FP16, FP32, HF4, HF8,
    INDEX, INT4, INT8, INT16, INT32, INT64, TASK_ID, UINT4, UINT8, UINT16, UINT32, UINT64, DataType,
)
from pypto_rt.language.enums import (
    DN, MX_A_ZZ, MX_B_NN, ND, NZ, AtomicType, CastMode, FunctionType, Level, MaskPattern, Mem, MemorySpace,
    PadValue, Role, ScopeMode, SplitMode, TensorLayout,
)
from pypto_rt.language.ops import OpStub, make_namespaces
from pypto_rt.language.scopes import (
    at, cluster, cond, cross_core_slot, manual_scope, parallel, pipeline, scope, spmd, split, split_aiv, unroll,
    while_, yield_,
)
from pypto_rt.language.scopes import range  # noqa: A004 - the DSL's loop
from pypto_rt.language.types import (
    Array, DynVar, InOut, Out, Scalar, TaskId, Tensor, TensorView, Tile, Tuple, dynamic,
)

_namespaces = make_namespaces(_surface.NAMESPACES)
tensor = _namespaces["tensor"]
tile = _namespaces["tile"]
system = _namespaces["system"]
array = _namespaces["array"]
prefetch = _namespaces["prefetch"]

_OPS = {name: OpStub(name) for name in sorted(_surface.TOP)}
globals().update(_OPS)

__all__ = sorted({
    "DataType", "FP32", "BF16", "FP16", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
    "BOOL", "INDEX", "FP8E4M3FN", "FP8E5M2", "FP8E8M0", "FP4", "INT4", "UINT4", "HF4", "HF8", "TASK_ID",
    "DEFAULT_CONST_INT", "DEFAULT_CONST_FLOAT", "Level", "SplitMode", "PadValue", "MemorySpace", "Mem", "AtomicType",
    "FunctionType", "Role", "TensorLayout", "ND", "DN", "NZ", "MX_A_ZZ", "MX_B_NN", "MaskPattern", "ScopeMode",
    "CastMode", "Tensor", "Out", "InOut", "Scalar", "Tile", "Array", "Tuple", "TaskId", "TensorView", "DynVar",
    "dynamic", "jit", "inline", "function", "program", "KernelFunction", "at", "scope", "manual_scope", "cluster",
    "range", "parallel", "pipeline", "unroll", "spmd", "split_aiv", "yield_", "while_", "cond", "split",
    "cross_core_slot", "tensor", "tile", "system", "array", "prefetch", *_OPS,
})


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnknownOpError(f"unknown op or name pl.{name}", user_span(2),
                         "see the pl surface in the README (or dir(pl)) for what exists")


def __dir__():
    return __all__
