"""PyPTO data types (`pl.FP32`, `pl.BF16`, ...) as plain descriptors.

Torch-free: the mapping to torch storage dtypes lives in `pypto_rt.ops.dtype_rules`.
"""
from __future__ import annotations

__all__ = [
    "DataType", "FP32", "BF16", "FP16", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16",
    "UINT32", "UINT64", "BOOL", "INDEX", "FP8E4M3FN", "FP8E5M2", "FP8E8M0", "FP4", "INT4", "UINT4",
    "HF4", "HF8", "TASK_ID", "DEFAULT_CONST_INT", "DEFAULT_CONST_FLOAT", "ALL_DTYPES",
]


class DataType:
    """One PyPTO element type. Instances are singletons; compare with `==` or `is`."""

    __slots__ = ("name", "bits", "kind", "_str")

    def __init__(self, name: str, bits: int, kind: str, text: str):
        self.name = name
        self.bits = bits
        self.kind = kind  # "float" | "int" | "uint" | "bool" | "opaque"
        self._str = text

    def get_bit(self) -> int:
        """Bits per element."""
        return self.bits

    def get_byte(self) -> int:
        """Bytes per element; 4-bit types round up to 1."""
        return max(1, (self.bits + 7) // 8)

    def is_float(self) -> bool:
        return self.kind == "float"

    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    def is_signed_int(self) -> bool:
        return self.kind == "int"

    def is_unsigned_int(self) -> bool:
        return self.kind == "uint"

    def __str__(self) -> str:
        return self._str

    def __repr__(self) -> str:
        return f"pl.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


FP32 = DataType("FP32", 32, "float", "fp32")
BF16 = DataType("BF16", 16, "float", "bfloat16")
FP16 = DataType("FP16", 16, "float", "fp16")
INT8 = DataType("INT8", 8, "int", "int8")
INT16 = DataType("INT16", 16, "int", "int16")
INT32 = DataType("INT32", 32, "int", "int32")
INT64 = DataType("INT64", 64, "int", "int64")
UINT8 = DataType("UINT8", 8, "uint", "uint8")
UINT16 = DataType("UINT16", 16, "uint", "uint16")
UINT32 = DataType("UINT32", 32, "uint", "uint32")
UINT64 = DataType("UINT64", 64, "uint", "uint64")
BOOL = DataType("BOOL", 8, "bool", "bool")
INDEX = DataType("INDEX", 64, "int", "index")
FP8E4M3FN = DataType("FP8E4M3FN", 8, "float", "fp8e4m3fn")
FP8E5M2 = DataType("FP8E5M2", 8, "float", "fp8e5m2")
FP8E8M0 = DataType("FP8E8M0", 8, "float", "fp8e8m0")
FP4 = DataType("FP4", 4, "float", "fp4")
INT4 = DataType("INT4", 4, "int", "int4")
UINT4 = DataType("UINT4", 4, "uint", "uint4")
HF4 = DataType("HF4", 4, "float", "hf4")
HF8 = DataType("HF8", 8, "float", "hf8")
TASK_ID = DataType("TASK_ID", 64, "opaque", "task_id")

DEFAULT_CONST_INT = INT64
DEFAULT_CONST_FLOAT = FP32

ALL_DTYPES = {dt.name: dt for dt in (
    FP32, BF16, FP16, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, BOOL, INDEX,
    FP8E4M3FN, FP8E5M2, FP8E8M0, FP4, INT4, UINT4, HF4, HF8, TASK_ID)}


def _by_name(name: str) -> DataType:
    return ALL_DTYPES[name]
