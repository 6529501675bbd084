"""Numbers read from tensor data while a run is recorded for replay: they remember how they were computed.

A recorded run (replay.capture) that reads a scalar with `pl.read` gets a `TracedInt` (an `int`) or a
`TracedFloat` (a `float`) with the value read, carrying `code`, the Python expression that computes it in the
replay (`s3`, `(s3 + 1)`). Arithmetic with other numbers gives traced numbers again, so a value computed from data
reaches the torch calls that use it (`cache[slot:slot + 1]`, `x * scale`) as code, not as the number seen when
recording. Everything else the program does with it fixes its course, and becomes a *guard* the replay checks
before it touches any data:
- a comparison or truth test: the replay needs the same outcome (`if slot >= 0:`);
- any other use as a plain number (`int(x)`, `float(x)`, `round(x)`, formatting, `range(x)` through `int`): the
  replay needs the same value (the value is *pinned*).
A replay whose guards fail runs on the engine instead. Python's own C code reads int and float subclasses as
plain numbers without asking (a list index, `range(x)`, `math.sqrt(x)`): pypto-rt's helpers pin values before
the uses they make (`plain`, `plain_key`); the user's own code calling such functions is not seen.

The recorder the value belongs to is `rec`, with `guard(left, symbol, right, outcome)` (its sides: numbers, traced
or plain), `refuse(reason)` and `active`; once the recording ends (or is refused) the value behaves as the plain
number it is. `symbols` names the values read from data (or parameters) the number was computed from.
"""
from __future__ import annotations

import builtins
import math
import operator

import torch

from pypto_rt.ops.recording import ScalarFromData
from pypto_rt.ops.value import TensorValue


class TracedInt(int, ScalarFromData):
    """`TracedInt(value, code, recorder)`: an int read from data (or computed from one) while recording."""
    code: str
    rec: object
    symbols: frozenset

    def pin(self) -> int:
        """This value, fixed: the replay checks it is the same."""
        value = int.__int__(self)
        if self.rec.active:
            self.rec.guard(self, "==", value, True)
        return value

    def __int__(self):
        return self.pin()

    def __index__(self):
        return self.pin()

    def __float__(self):
        return float(self.pin())

    def __reduce__(self):
        return int, (self.pin(),)

    def __round__(self, ndigits=None):
        return self if ndigits is None or ndigits >= 0 else round(self.pin(), ndigits)

    def __trunc__(self):
        return self

    __floor__ = __ceil__ = __trunc__

    def __invert__(self):
        return _derived(self, int.__invert__(self), f"(~{self.code})")


class TracedFloat(float, ScalarFromData):
    """`TracedFloat(value, code, recorder)`: a float read from data (or computed from one) while recording."""
    code: str
    rec: object
    symbols: frozenset

    def pin(self) -> float:
        """This value, fixed: the replay checks it is the same (a value that is not finite cannot be: the
        recording is refused)."""
        value = float.__float__(self)
        if self.rec.active:
            if math.isfinite(value):
                self.rec.guard(self, "==", value, True)
            else:
                self.rec.refuse(f"the run's course depends on a value read from data that is {value}")
        return value

    def __float__(self):
        return self.pin()

    def __int__(self):
        return int(self.pin())

    def __reduce__(self):
        return float, (self.pin(),)

    def __round__(self, ndigits=None):
        return round(self.pin(), ndigits)

    def __trunc__(self):
        return math.trunc(self.pin())

    def __floor__(self):
        return math.floor(self.pin())

    def __ceil__(self):
        return math.ceil(self.pin())

    def is_integer(self):
        return self.pin().is_integer()


TRACED = (TracedInt, TracedFloat)


def _common(cls, base) -> None:
    """The methods both kinds share, on `base`'s operations."""

    def __new__(kind, value, code: str, rec, symbols: frozenset | None = None):
        self = base.__new__(kind, value)
        self.code = code
        self.rec = rec
        self.symbols = frozenset((code,)) if symbols is None else symbols   # (a fresh one: its code is its name)
        return self

    cls.__new__ = __new__

    def __bool__(self):
        out = base.__ne__(self, 0)
        if self.rec.active:
            self.rec.guard(self, "!=", 0, out)
        return out

    def __repr__(self):
        return repr(self.pin())

    def __format__(self, spec):
        return format(self.pin(), spec)

    def __neg__(self):
        return _derived(self, base.__neg__(self), f"(-{self.code})")

    def __pos__(self):
        return self

    def __abs__(self):
        return _derived(self, base.__abs__(self), f"abs({self.code})")

    def __divmod__(self, other):
        return self // other, self % other

    def __rdivmod__(self, other):
        return other // self, other % self

    for method in (__bool__, __repr__, __format__, __neg__, __pos__, __abs__, __divmod__, __rdivmod__):
        setattr(cls, method.__name__, method)
    cls.__str__ = __repr__
    symbols = [("add", "+"), ("sub", "-"), ("mul", "*"), ("floordiv", "//"), ("mod", "%"), ("truediv", "/"),
               ("pow", "**")]
    if base is int:
        symbols += [("lshift", "<<"), ("rshift", ">>"), ("and", "&"), ("or", "|"), ("xor", "^")]
    for name, symbol in symbols:
        setattr(cls, f"__{name}__", _arithmetic(base, f"__{name}__", symbol, False))
        setattr(cls, f"__r{name}__", _arithmetic(base, f"__r{name}__", symbol, True))
    for name, symbol in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")):
        setattr(cls, f"__{name}__", _comparison(base, f"__{name}__", symbol))
    cls.__hash__ = base.__hash__   # defining __eq__ cleared it; a dict lookup that finds a key compares (guards)


def traced(value, code: str, rec, symbols: frozenset | None = None):
    """A traced number of `value`'s kind: a TracedInt for an int, a TracedFloat for a float; `symbols`: what it
    was computed from (a new symbol, named `code`, by default)."""
    kind = TracedInt if type(value) is int else TracedFloat
    return kind(value, code, rec, symbols)


def symbols_of(value) -> frozenset:
    """The values read from data (or parameters) a number was computed from: none for a plain number."""
    return value.symbols if type(value) in TRACED else frozenset()


def untraced(value):
    """`value` as the plain number it is, without pinning it (for pypto-rt's own bookkeeping)."""
    kind = type(value)
    return int.__int__(value) if kind is TracedInt else float.__float__(value) if kind is TracedFloat else value


def integral(value):
    """An index or offset as ops take it: an int, a TracedInt as it is (it keeps its code), anything else via
    int()."""
    return value if type(value) is int or type(value) is TracedInt else int(value)


def plain(value):
    """`value` as a plain number when it is traced (pinned: the replay checks it), else unchanged."""
    return value.pin() if type(value) in TRACED else value


def plain_key(key):
    """A subscript key for a plain Python container (a list, a tuple): traced numbers in it pinned, since Python
    reads an int subclass as a plain int without asking."""
    if type(key) in TRACED:
        return key.pin()
    if type(key) is slice and (type(key.start) in TRACED or type(key.stop) in TRACED or type(key.step) in TRACED):
        return slice(plain(key.start), plain(key.stop), plain(key.step))
    if type(key) is tuple:
        return tuple(plain_key(k) for k in key)
    return key


def host_key(owner, key):
    """The key of `owner[key]` in a host program: as it is for a tensor (TracedInts become offsets of the
    window), pinned for anything else (see `plain_key`); owner None: not known, pinned."""
    return key if type(owner) is TensorValue else plain_key(key)


def code_of(value) -> str:
    """Python code for a number: a traced one's expression, else a literal (1e999 stands for infinity)."""
    if type(value) in TRACED:
        return value.code
    if type(value) is float and not math.isfinite(value):
        return "(1e999 - 1e999)" if value != value else ("1e999" if value > 0 else "(-1e999)")
    return repr(value)


_MIRRORED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def arithmetic(name: str, left, right):
    """`left <op> right` (`name` as in `operator`); a plain float with a TracedInt on the right asks the TracedInt
    (its reflected method): float's own method would read it as a plain int without asking."""
    if type(right) is TracedInt and type(left) is float:
        return getattr(right, f"__r{name.rstrip('_')}__")(left)
    return getattr(operator, name)(left, right)


def compare(name: str, left, right):
    """`left <op> right`; a plain float with a TracedInt on the right asks the TracedInt (the mirrored op)."""
    if type(right) is TracedInt and type(left) is float:
        return getattr(right, f"__{_MIRRORED[name]}__")(left)
    return getattr(operator, name)(left, right)


def _extreme(name: str, pick):
    def extreme(*args, key=None, **kwargs):
        if len(args) == 2 and key is None and not kwargs and type(args[0]) not in TRACED \
                and type(args[1]) not in TRACED:
            return pick(*args)   # the common case (pl.min of plain numbers): the builtin
        items = args[0] if len(args) == 1 else args
        if key is not None or kwargs or type(items) not in (tuple, list) or not items:
            return pick(*args, key=key, **kwargs) if key is not None else pick(*args, **kwargs)
        best = items[0]
        for item in items[1:]:   # the first of equal items wins, as with the builtin
            if compare(name, item, best):
                best = item
        return best
    extreme.__name__ = pick.__name__
    extreme.__doc__ = f"`{pick.__name__}` comparing through `compare`."
    return extreme


smallest = _extreme("lt", builtins.min)
largest = _extreme("gt", builtins.max)


def _derived(source, value, code: str, other=None):
    """`value`, computed from traced `source` (and `other`) as `code`: traced while the recording is active."""
    if not source.rec.active:
        return value
    return traced(value, code, source.rec, source.symbols | other.symbols if type(other) in TRACED else source.symbols)


_NUMBERS = (int, bool, float, TracedInt, TracedFloat)


def _arithmetic(base, name: str, symbol: str, reflected: bool):
    operation = getattr(base, name)
    as_float = getattr(float, name, None)

    def method(self, other, *modulo):
        if modulo:   # three-argument pow
            return operation(self.pin(), other, *modulo)
        out = operation(self, other)
        if not self.rec.active:
            return out
        if out is NotImplemented:
            if type(other) is TracedFloat or isinstance(other, (TensorValue, torch.Tensor)):
                return out   # the other side takes it as code (a traced float's own method, a tensor op)
            if base is int and type(other) is float and as_float is not None:
                out = as_float(float(int.__int__(self)), other)   # what Python does: the int as a float
            else:
                self.pin()   # a list repeat, an unknown type, ...: it reads the number silently
                return out
        if type(other) in _NUMBERS and type(out) in (int, float):
            left, right = (code_of(other), self.code) if reflected else (self.code, code_of(other))
            return _derived(self, out, f"({left} {symbol} {right})", other)
        self.pin()
        return out

    method.__name__ = name
    return method


def _comparison(base, name: str, symbol: str):
    operation, plain_compare = getattr(base, name), getattr(operator, name)

    def method(self, other):
        out = operation(self, other)
        if not self.rec.active:
            return out
        if out is NotImplemented:
            if type(other) is TracedFloat or isinstance(other, (TensorValue, torch.Tensor)):
                return out   # the other side compares it as code
            if type(other) is not float:
                self.pin()   # an unknown type: it reads the number silently
                return out
            out = plain_compare(int.__int__(self), other)
        if type(other) in _NUMBERS:
            self.rec.guard(self, symbol, other, out)
        else:
            self.pin()
        return out

    method.__name__ = name
    return method


_common(TracedInt, int)
_common(TracedFloat, float)
