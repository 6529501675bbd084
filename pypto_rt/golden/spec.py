"""Argument specifications for the golden harness: `TensorSpec` and `ScalarSpec`.

A kernel's arguments are described by a list of specs whose order *is* the kernel's
parameter order. A `TensorSpec` says how to build a tensor (and whether the kernel
writes it); a `ScalarSpec` carries one scalar value of a fixed dtype.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TensorSpec", "ScalarSpec", "SUPPORTED_SCALAR_DTYPES"]

# torch factories that `TensorSpec` calls as `factory(shape, dtype=dtype)`.
_SHAPE_FACTORIES = (torch.randn, torch.rand, torch.zeros, torch.ones)


@dataclass
class TensorSpec:
    """One tensor argument of a kernel.

    Attributes:
        name: Parameter name; the position in the spec list is the argument position.
        shape: Shape of the tensor to create.
        dtype: torch dtype of the tensor.
        init_value: How to fill the tensor. `None` gives zeros; an `int`/`float` fills every
            element; a `torch.Tensor` is cast to `dtype` (its own shape is kept); one of
            `torch.randn`, `torch.rand`, `torch.zeros`, `torch.ones` is called as
            `factory(shape, dtype=dtype)`; any other callable is called with no arguments and
            its result converted with `torch.as_tensor(..., dtype=dtype)`. Inputs are not
            seeded: each run draws fresh random values.
        is_output: The kernel writes this tensor and the harness checks it against the golden.
            Without `init_value` it is a pure output (`pl.Out`); with one, an in/out state
            (`pl.InOut`) whose initial value comes from `init_value`.
        resident: Device-residency mode on the NPU: `None`/`False`, a worker id `>= 0`, or
            `"stacked"`. Validated, then ignored on the CPU.
    """

    name: str
    shape: Any
    dtype: torch.dtype
    init_value: Any = None
    is_output: bool = False
    resident: int | str | bool | None = None

    def __post_init__(self) -> None:
        _check_resident(self.name, self.resident)

    @property
    def is_resident(self) -> bool:
        """True when a residency mode (worker id or `"stacked"`) is set."""
        return self.resident is not None and self.resident is not False

    @property
    def is_pure_output(self) -> bool:
        """True for an output with no initial value (the kernel's `pl.Out`)."""
        return self.is_output and self.init_value is None

    def create_tensor(self) -> torch.Tensor:
        """Build a fresh tensor from `init_value`.

        Returns:
            A new tensor of `dtype` (of `shape`, unless `init_value` is a tensor).

        Raises:
            TypeError: `init_value` is of a kind listed nowhere above.
        """
        init = self.init_value
        if init is None:
            return torch.zeros(self.shape, dtype=self.dtype)
        if isinstance(init, (int, float)):
            return torch.full(self.shape, init, dtype=self.dtype)
        if isinstance(init, torch.Tensor):
            return init.to(dtype=self.dtype)
        if any(init is factory for factory in _SHAPE_FACTORIES):
            return init(self.shape, dtype=self.dtype)
        if callable(init):
            return torch.as_tensor(init(), dtype=self.dtype)
        raise TypeError(
            f"TensorSpec {self.name!r}: init_value of type {type(init).__name__} is not supported; "
            "use None, a number, a torch.Tensor, torch.randn/rand/zeros/ones or a no-argument callable"
        )


def _check_resident(name: str, resident: Any) -> None:
    """Raise `ValueError` unless `resident` is None/False, an int worker id >= 0 or "stacked"."""
    if resident is None or resident is False or resident == "stacked":
        return
    if resident is True:
        raise ValueError(
            f"TensorSpec {name!r}: resident=True is ambiguous; pass a worker id (e.g. resident=0) or 'stacked'"
        )
    if isinstance(resident, int):
        if resident < 0:
            raise ValueError(f"TensorSpec {name!r}: resident worker id must be >= 0, got {resident}")
        return
    raise ValueError(
        f"TensorSpec {name!r}: resident must be None/False, a worker id >= 0 or 'stacked', got {resident!r}"
    )


# Integer scalar dtypes: (ctypes type, smallest value, largest value).
_INT_DTYPES: dict[torch.dtype, tuple[type, int, int]] = {
    torch.int8: (ctypes.c_int8, -(2**7), 2**7 - 1),
    torch.int32: (ctypes.c_int32, -(2**31), 2**31 - 1),
    torch.int64: (ctypes.c_int64, -(2**63), 2**63 - 1),
    torch.uint8: (ctypes.c_uint8, 0, 2**8 - 1),
}
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

SUPPORTED_SCALAR_DTYPES: tuple[torch.dtype, ...] = (*_INT_DTYPES, torch.bool, *_FLOAT_DTYPES)


@dataclass
class ScalarSpec:
    """One scalar argument of a kernel (a `pl.Scalar[...]` parameter).

    Attributes:
        name: Parameter name; the position in the spec list is the argument position.
        dtype: One of `SUPPORTED_SCALAR_DTYPES` (int8, int32, int64, uint8, bool, float32,
            float16, bfloat16).
        value: An `int`/`float`/`bool` checked against `dtype` (ints are range-checked; a bool
            is not an int here), or a 0-dim tensor of exactly `dtype`. After construction it is
            always a 0-dim tensor of `dtype`, so half-precision values are already rounded.
    """

    name: str
    dtype: torch.dtype
    value: Any

    def __post_init__(self) -> None:
        if self.dtype not in SUPPORTED_SCALAR_DTYPES:
            raise ValueError(
                f"ScalarSpec {self.name!r}: dtype {self.dtype} is not supported; "
                f"use one of {list(SUPPORTED_SCALAR_DTYPES)}"
            )
        if isinstance(self.value, torch.Tensor):
            self._check_tensor_value(self.value)
            return
        _check_python_value(self.name, self.dtype, self.value)
        self.value = torch.tensor(self.value, dtype=self.dtype)

    def _check_tensor_value(self, value: torch.Tensor) -> None:
        if value.ndim != 0:
            raise ValueError(f"ScalarSpec {self.name!r}: a tensor value must be 0-dim, got shape {tuple(value.shape)}")
        if value.dtype != self.dtype:
            raise ValueError(f"ScalarSpec {self.name!r}: value dtype {value.dtype} differs from dtype {self.dtype}")

    def to_python(self) -> int | float | bool:
        """Return the value as a Python number, at the dtype's precision."""
        return self.value.item()

    def to_ctypes(self) -> ctypes._SimpleCData:
        """Return the value as a ctypes scalar; float16/bfloat16 become their bit pattern in `c_uint16`."""
        if self.dtype in _INT_DTYPES:
            return _INT_DTYPES[self.dtype][0](int(self.value.item()))
        if self.dtype is torch.bool:
            return ctypes.c_bool(bool(self.value.item()))
        if self.dtype is torch.float32:
            return ctypes.c_float(float(self.value.item()))
        bits = int(self.value.view(torch.int16).item())
        return ctypes.c_uint16(bits & 0xFFFF)


def _check_python_value(name: str, dtype: torch.dtype, value: Any) -> None:
    """Raise `ValueError` unless the Python `value` fits `dtype`."""
    kind = type(value).__name__
    if dtype in _INT_DTYPES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"ScalarSpec {name!r}: dtype {dtype} needs an int value, got {kind}")
        _, low, high = _INT_DTYPES[dtype]
        if not low <= value <= high:
            raise ValueError(f"ScalarSpec {name!r}: value {value} is outside the range of {dtype} [{low}, {high}]")
    elif dtype is torch.bool:
        if not isinstance(value, bool):
            raise ValueError(f"ScalarSpec {name!r}: dtype torch.bool needs a bool value, got {kind}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"ScalarSpec {name!r}: dtype {dtype} needs an int or float value, got {kind}")

