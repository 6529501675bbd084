"""Integers read from tensor data while a run is recorded for replay: they remember how they were computed.

A recorded run (orchestration.torch_trace) that reads an integer with `pl.read` gets a `TracedInt`: an `int`
with the value read, carrying `code`, the Python expression that computes it in the replay (`s3`, `(s3 + 1)`).
Arithmetic with other integers gives TracedInts again, so a value computed from data reaches the torch calls
that use it (`cache[slot:slot + 1]`) as code, not as the number seen when recording. Everything else the
program does with it fixes its course, and becomes a *guard* the replay checks before it touches any data:
- a comparison or truth test: the replay needs the same outcome (`if slot >= 0:`);
- any other use as a plain number (`int(x)`, `range(x)` through `int`, formatting, float arithmetic): the replay
  needs the same value (the value is *pinned*).
A replay whose guards fail runs on the engine instead. Python's own C code reads int subclasses as plain ints
without asking (a list index, `range(x)`): pypto-rt's helpers pin values before such uses (`plain`).

The recorder the value belongs to is `rec`, with `guard(left, symbol, right, outcome)` and `active`; once the recording
ends (or is refused) the value behaves as the plain int it is.
"""
from __future__ import annotations

import math
import operator

import torch

from pypto_rt.ops.value import TensorValue


class TracedInt(int):
    code: str
    rec: object

    def __new__(cls, value: int, code: str, rec) -> TracedInt:
        self = int.__new__(cls, value)
        self.code = code
        self.rec = rec
        return self

    def pin(self) -> int:
        """This value, fixed: the replay checks it is the same."""
        value = int.__int__(self)
        if self.rec.active:
            self.rec.guard(self.code, "==", repr(value), True)
        return value

    def __int__(self):
        return self.pin()

    def __index__(self):
        return self.pin()

    def __float__(self):
        return float(self.pin())

    def __bool__(self):
        out = int.__ne__(self, 0)
        if self.rec.active:
            self.rec.guard(self.code, "!=", "0", out)
        return out

    def __repr__(self):
        return repr(self.pin())

    __str__ = __repr__

    def __format__(self, spec):
        return format(self.pin(), spec)

    def __reduce__(self):
        return int, (self.pin(),)

    __hash__ = int.__hash__   # a dict or set lookup that finds a key compares with ==, which guards

    def __round__(self, ndigits=None):
        return self if ndigits is None or ndigits >= 0 else round(self.pin(), ndigits)

    def __trunc__(self):
        return self

    __floor__ = __ceil__ = __trunc__

    def __neg__(self):
        return _derived(self, int.__neg__(self), f"(-{self.code})")

    def __pos__(self):
        return self

    def __abs__(self):
        return _derived(self, int.__abs__(self), f"abs({self.code})")

    def __invert__(self):
        return _derived(self, int.__invert__(self), f"(~{self.code})")

    def __divmod__(self, other):
        return self // other, self % other

    def __rdivmod__(self, other):
        return other // self, other % self


def plain(value):
    """`value` as a plain int when it is a TracedInt (pinned: the replay checks it), else unchanged."""
    return value.pin() if type(value) is TracedInt else value


def plain_key(key):
    """A subscript key for a plain Python container (a list, a tuple): TracedInts in it pinned, since Python reads
    an int subclass as a plain int without asking."""
    if type(key) is TracedInt:
        return key.pin()
    if type(key) is slice and (type(key.start) is TracedInt or type(key.stop) is TracedInt
                               or type(key.step) is TracedInt):
        return slice(plain(key.start), plain(key.stop), plain(key.step))
    if type(key) is tuple:
        return tuple(plain_key(k) for k in key)
    return key


def host_key(owner, key):
    """The key of `owner[key]` in a host program: as it is for a tensor (TracedInts become offsets of the
    window), pinned for anything else (see `plain_key`); owner None: not known, pinned."""
    return key if type(owner) is TensorValue else plain_key(key)


def _code(value) -> str:
    return value.code if type(value) is TracedInt else repr(value)


def _derived(source: TracedInt, value, code: str):
    return TracedInt(value, code, source.rec) if source.rec.active else value


_INTEGRAL = (int, bool)


def _arithmetic(name: str, symbol: str, reflected: bool):
    base = getattr(int, name)

    def method(self, other, *modulo):
        if modulo:   # three-argument pow
            return base(self.pin(), other, *modulo)
        out = base(self, other)
        if not self.rec.active:
            return out
        if out is NotImplemented:
            if not isinstance(other, (TensorValue, torch.Tensor)):   # tensors take it as code; a list repeat,
                self.pin()                                            # float arithmetic, ... read it silently
            return out
        if type(out) is int and (type(other) in _INTEGRAL or type(other) is TracedInt):
            left, right = (_code(other), self.code) if reflected else (self.code, _code(other))
            return TracedInt(out, f"({left} {symbol} {right})", self.rec)
        self.pin()   # a float or unusual result: this value decides it
        return out

    method.__name__ = name
    return method


def _comparison(name: str, symbol: str):
    base, plain_compare = getattr(int, name), getattr(operator, name)

    def method(self, other):
        out = base(self, other)
        if not self.rec.active:
            return out
        if out is NotImplemented:
            if type(other) is not float:   # a tensor compares it as code; anything else is pinned
                if not isinstance(other, (TensorValue, torch.Tensor)):
                    self.pin()
                return out
            out = plain_compare(int.__int__(self), other)
        if type(other) in _INTEGRAL or type(other) is TracedInt or (type(other) is float and math.isfinite(other)):
            self.rec.guard(self.code, symbol, _code(other), out)
        else:
            self.pin()
        return out

    method.__name__ = name
    return method


for _name, _symbol in (("add", "+"), ("sub", "-"), ("mul", "*"), ("floordiv", "//"), ("mod", "%"),
                       ("truediv", "/"), ("pow", "**"), ("lshift", "<<"), ("rshift", ">>"), ("and", "&"),
                       ("or", "|"), ("xor", "^")):
    setattr(TracedInt, f"__{_name}__", _arithmetic(f"__{_name}__", _symbol, False))
    setattr(TracedInt, f"__r{_name}__", _arithmetic(f"__r{_name}__", _symbol, True))
for _name, _symbol in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")):
    setattr(TracedInt, f"__{_name}__", _comparison(f"__{_name}__", _symbol))
TracedInt.__hash__ = int.__hash__   # defining __eq__ cleared it
