"""Finding a replayed call's specialisation from the caller's own arguments, with the fewest Python operations.

A replayed call must not spend on finding its recording what the recording saves: reading every tensor's shape,
strides, offset, dtype, device and storage one method call at a time (replay.entry `_key`) costs ~1 µs a tensor.
An `ArgumentMatch` holds what a specialisation's key says about arguments like those it was made from, laid out
to be checked in bulk: the argument types and plain values as tuples, and per tensor its sizes, strides, dtype and
device checked in C by torch's own tensor guards (those torch.compile checks before reusing a graph; a Python
comparison where this torch has none), its storage offset, and which tensors share storage. A `@pl.program`
method's `self` is matched by identity, as the key has it.

Invariant: `matches(args)` holds only where `_key(args)` equals the key of the arguments it was made from. It may be
stricter (a tensor that requires grad, a call in another dispatch mode, empty tensors): such a call goes the
bound way, which is exact.
"""
from __future__ import annotations

import operator

import torch

try:   # (private to torch; absent or changed: the Python comparison below does the same)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:   # pragma: no cover - torch builds without dynamo
    _TensorGuards = None

_TENSOR = torch.Tensor
_PLAIN = frozenset((int, float, bool, str, type(None)))
_offset = torch.Tensor.storage_offset
_storage = torch.Tensor.untyped_storage
_storage_ptr = torch.UntypedStorage.data_ptr
_layout = operator.attrgetter("shape", "dtype", "device")


class ArgumentMatch:
    """What one specialisation's key says about the caller's own arguments, to check in bulk (see the module)."""
    __slots__ = ("kinds", "tensor_at", "value_at", "values", "guard", "layout", "offsets", "groups", "same_at",
                 "same")

    def __init__(self, args: tuple, tensors: list, storages: tuple):
        self.kinds = tuple(map(type, args))
        every = len(tensors) == len(args)
        self.tensor_at = None if every else [i for i, kind in enumerate(self.kinds) if kind is _TENSOR]
        self.value_at = None if every else [i for i, kind in enumerate(self.kinds) if kind is not _TENSOR]
        self.values = None if every else tuple(args[i] for i in self.value_at)
        # a program's `self`: the very object (the values' `==` could hold for another); None when there is none
        self.same_at = [i for i in self.value_at or () if self.kinds[i] not in _PLAIN] or None
        self.same = None if self.same_at is None else tuple(args[i] for i in self.same_at)
        self.guard = _guard(tensors)
        self.layout = None if self.guard is not None else _layouts(tensors)
        self.offsets = tuple(map(_offset, tensors))
        self.groups = _groups(storages)

    @staticmethod
    def of(args: tuple) -> "ArgumentMatch | None":
        """The match for arguments like `args`; None for arguments it cannot describe (an argument of another
        kind, an empty tensor: those go the bound way)."""
        kinds = set(map(type, args))
        if not all(kind in _PLAIN or kind is _TENSOR or getattr(kind, "__pypto_program__", False) for kind in kinds):
            return None
        tensors = [a for a in args if type(a) is _TENSOR]
        storages = tuple(map(_storage_ptr, map(_storage, tensors)))
        if not all(storages):   # (an empty tensor has no storage to tell sharing by)
            return None
        return ArgumentMatch(args, tensors, storages)

    def matches(self, args: tuple) -> bool:
        """Whether `args` have this match's specialisation (may raise RuntimeError for a tensor without storage
        or strides: binding says what is wrong with it)."""
        if self.tensor_at is None and self.guard is not None:   # (the guard checks each is exactly a Tensor)
            if len(args) != len(self.kinds):
                return False
            tensors = args
        elif tuple(map(type, args)) != self.kinds:
            return False
        elif self.tensor_at is None:
            tensors = args
        else:
            if self.same_at is not None and any(args[i] is not v for i, v in zip(self.same_at, self.same)):
                return False
            if tuple([args[i] for i in self.value_at]) != self.values:
                return False
            tensors = [args[i] for i in self.tensor_at]
        if self.guard is not None:
            if not self.guard.check(*tensors):
                return False
        elif _layouts(tensors) != self.layout:
            return False
        if tuple(map(_offset, tensors)) != self.offsets:
            return False
        storages = tuple(map(_storage_ptr, map(_storage, tensors)))
        if self.groups is None and len(set(storages)) == len(storages):   # (none share: the common case, inline)
            return all(storages)
        return all(storages) and _groups(storages) == self.groups

    def inputs(self, args: tuple):
        """The replay function's arguments: the tensors in place, None for plain values (the specialisation has
        them)."""
        return args if self.tensor_at is None else [a if type(a) is _TENSOR else None for a in args]


def _layouts(tensors) -> tuple:
    return tuple(zip(map(_layout, tensors), map(_TENSOR.stride, tensors)))


def _groups(storages: tuple) -> tuple | None:
    """Which tensors share storage, as first-seen group numbers; None when none do (the common case, cheap)."""
    if len(set(storages)) == len(storages):
        return None
    first: dict = {}
    return tuple(first.setdefault(s, len(first)) for s in storages)


def _guard(tensors: list):
    """torch's C check of the tensors' sizes, strides, dtype, device (and dispatch keys, grad), or None."""
    if _TensorGuards is None or not tensors:
        return None
    try:
        guard = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                              dynamic_dims_strides=[list(t.stride()) for t in tensors])
        return guard if guard.check(*tensors) else None
    except Exception:   # noqa: BLE001 - another torch's signature: the Python comparison does the same
        return None
