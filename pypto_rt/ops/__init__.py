"""The op library: what every `pl` op computes, on torch (CPU).

The one place op semantics live. Every executor calls it (or, for compiled
backends, is tested against it). Importing this package registers every op in
`registry.OPS` and its OpDef in `opdef.OPDEFS` (what the compiler and the host know about it). Imports only
`errors` and `language` (dtypes, enums, opdocs) from pypto_rt, and `collective` for the `pld` ops (windows and
communicators).
"""
from pypto_rt.ops import (  # noqa: F401  (imported for registration)
    access, bitwise, cast, collectives, comparison, create, distributed, elementwise, gather, matmul, mgather, mscatter,
    reduce, sort, system, unary, views,
)
from pypto_rt.ops.registry import OPS
from pypto_rt.ops.value import TensorValue

__all__ = ["OPS", "TensorValue"]
