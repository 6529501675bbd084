"""Recording the torch calls of a run as straight-line Python, to run again without the runtime around them.

`Recorder` is a torch function mode: on the thread that enters it, every torch call (functions, tensor methods,
factories, property reads) passes through it. Calls that make or change tensors become lines of a function,
`v7 = sum_3(v2, dim=-1, keepdim=True)`; the run's entry tensors are its parameters `a0, a1, ...`, the
functions and constants it uses are its globals.

Numbers read from data: `pl.read` asks `read_scalar` and gets a `TracedInt` or `TracedFloat`
(ops.traced_scalar). When the element lies in an entry tensor the run has not written yet, the function starts
with a *prologue* that reads those elements again (`r0 = as_strided(a1, ...).tolist()`, `s3 = r0[7]`) and
checks the *guards* the run's course depended on (`if not (s3 >= 0): return _MISS`): a replay whose data would
take another course returns `GUARD_MISS` before touching any data. An element of data the run computed (or
wrote) is read again where the run read it (`s4 = v9[(0, 0)].item()`); a guard on such a value would come too
late, so it refuses the recording. Torch calls take the values as code
(`getitem(v2, (slice(s3, (s3 + 1), None), ...))`); a window at such offsets is guarded to stay inside its
tensor with its recorded extents, so its shape is static and only its place moves. A value taken as a size
(`torch.zeros(s3, 8)`) is pinned, so every shape stays static; reading the offset of a moving window refuses the
recording.

The recording is *refused* (`Recorder.refused` says why) when the run's course could depend on tensor data in a
way the prologue cannot check:
- a tensor's data becomes a Python value (`.item()`, `bool(t)`, `int(t)`, `.tolist()`, printing) other than
  through `read_scalar`, and that data depends on an entry tensor, an outside tensor or randomness (data
  computed from constants alone is static, so casting a Python scalar through a tensor is fine);
- an op whose result shape depends on data (`nonzero`, boolean-mask indexing, `unique`, ...) of an entry tensor,
  an outside tensor or chance (on data computed from constants alone, e.g. a valid-box mask, it is static);
- an argument the trace cannot write down as code (an object of unknown kind), an outside tensor sharing
  memory with an entry tensor (a view made before the run), or an op that declares itself non-replayable
  (`pypto_rt.ops.replay_guard.refuse`: communication, printing).
The op library calls torch only through its public API (no `torch.ops.aten`, no `torch._C`: those bypass the
mode; tests/compiled/test_replay.py checks). Metadata reads (`.shape`, `.dim()`, `.stride()`, `untyped_storage()`)
are not recorded: under one specialisation they give the same answers every time. Outside tensors (module
constants, op-library caches) are kept by reference.
"""
from __future__ import annotations

import ast
import math
import os
import random
import re
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

from pypto_rt.errors import is_internal_file
from pypto_rt.ops import replay_guard
from pypto_rt.ops.traced_scalar import TRACED, TracedInt, code_of, traced, untraced

# calls whose non-tensor results are metadata: static under one specialisation (same shapes, strides, dtypes)
_METADATA_TYPES = (torch.Size, torch.dtype, torch.device, torch.layout, torch.memory_format, torch.UntypedStorage)
_METADATA = {"dim", "ndimension", "size", "stride", "numel", "nelement", "element_size", "storage_offset",
             "is_contiguous", "is_floating_point", "is_complex", "is_signed", "get_device", "__len__", "__hash__",
             "data_ptr", "is_shared", "is_pinned", "__get__", "is_inference", "is_neg", "is_conj", "type"}
# calls that turn tensor data into Python values
_DATA_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy",
               "__array__", "__format__", "__repr__", "__str__", "equal", "allclose", "is_nonzero", "__contains__"}
# result shapes that depend on data
_DATA_SHAPED = {"nonzero", "nonzero_static", "argwhere", "masked_select", "unique", "unique_consecutive",
                "bincount", "repeat_interleave", "_unique2", "histogram"}
_RANDOM = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
           "multinomial", "normal", "uniform_", "normal_", "exponential_", "random_", "dropout"}
# a recording keeps every tensor the run makes alive (so ids and storages stay unique): it stops beyond this
MAX_HELD_BYTES = 2 << 30
_IN_PLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                     "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"}
_SIMPLE = (int, bool, str, type(None))
_KEY_BOUNDS = (int, TracedInt, type(None))   # slice bounds written in subscript syntax
_READABLE = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16,
             torch.float32, torch.float64}   # what read_scalar reads again (Python's .item() of them is exact)
# a storage of at most this many elements is read whole (`.tolist()`) by a replay that reads scalars from it
READ_WHOLE_ELEMENTS = 4096
# calls whose result is a window of their first argument at offsets given by their other arguments
_WINDOWS = {"__getitem__", "__setitem__", "narrow"}
# calls whose scalar arguments are operands, never sizes: their results are shaped by their tensors alone
_SCALAR_OPERANDS = {
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "maximum", "minimum",
    "lt", "le", "gt", "ge", "eq", "ne", "clamp", "clip", "clamp_min", "clamp_max", "where", "masked_fill",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "fill", "lerp"}
# calls whose scalar arguments are the contents of the tensor they make: its shape is the arguments' nesting
_CONTENTS = {"tensor", "as_tensor", "scalar_tensor", "full_like", "fill_", "fill"}
_SCALAR_OPERANDS |= {n + "_" for n in _SCALAR_OPERANDS} | {
    f"__{p}{n}__" for p in ("", "r", "i") for n in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift")} | {
    "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"}


_GETITEM, _SETITEM, _COPY = torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.copy_
_NEGATED = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_MIRRORED = {"==": "==", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_LITERAL = re.compile(r"-?[0-9.]+(e[-+]?[0-9]+)?")
_SYMBOL = re.compile(r"\bs\d+\b")


class _GuardMiss:
    def __repr__(self):
        return "GUARD_MISS"


GUARD_MISS = _GuardMiss()   # what a replay returns when its guards do not hold: the call runs on the engine


class Refused(Exception):
    """The run cannot be replayed; the message says why."""


class Recorder(TorchFunctionMode):
    """Use as `with Recorder(entry_tensors) as rec:` around the run, on the thread that runs all of it."""

    def __init__(self, inputs: list[torch.Tensor]):
        super().__init__()
        self.refused: str | None = None
        self.lines: list[_Line] = []
        self.names: dict[int, str] = {}                      # id(tensor) -> its name in the trace
        self.storage_of: dict[str, int] = {}                 # tensor name -> its memory's identity
        self.made: dict[str, torch.Tensor] = {}              # v* name -> the tensor the recorded run made
        self.constants: dict[str, object] = {}              # k*/f* names -> objects, injected into the trace
        self._const_ids: dict[int, str] = {}
        self._literals: dict[str, str] = {}                  # code of an index tuple or slice -> its constant
        self._alive: list = []                               # every tensor seen: ids stay unique while recording
        self._input_storages = set()
        self._tainted: set[int] = set()                      # storages whose data depends on inputs or chance
        self._held: set[int] = set()                         # storages the run made (kept alive while recording)
        self._held_bytes = 0
        self.params: list[str] = []
        # scalars read from data (orchestration reads `pl.read`): code that reads them and checks the guards
        self.active = False                                  # traced numbers made now record guards
        self.prologue: list[str] = []
        self.guards = 0
        self._guard_lines: set[str] = set()
        self._symbols = 0
        self._read_sources: dict[tuple, tuple[str, bool]] = {}   # (storage, dtype) -> (its name, read whole)
        self._late: set[str] = set()                         # symbols read in the body (from computed data)
        self._entry_of: dict[int, list] = {}                  # storage -> [(param name, tensor)]
        self._written: set[int] = set()                      # storages the run has written so far
        self._moving: set[int] = set()                       # ids of views whose offset depends on data
        self._muted = False
        self.place_read = False                              # the run asked where a tensor lies in its memory
        self._int_names: set[str] = set()                    # traced numbers' names whose values are ints
        self.calls = 0                                       # torch calls in the replay (once `source` made it)
        for i, t in enumerate(inputs):
            name = f"a{i}"
            self.params.append(name)
            if isinstance(t, torch.Tensor):
                self._input_storages.add(storage_id(t))
                self._tainted.add(storage_id(t))
                self.names.setdefault(id(t), name)
                self.storage_of[name] = storage_id(t)
                self._entry_of.setdefault(storage_id(t), []).append((name, t))
                self._alive.append(t)

    def __enter__(self):
        replay_guard.push(self)
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        replay_guard.pop()
        return super().__exit__(*exc)

    def scalar_input(self, index: int, value):
        """The number passed as parameter `index` (a kernel's loop index, its block index) as a traced number whose
        code is that parameter: offsets computed from it stay code, and what the course depends on is guarded at
        the replay's start."""
        self._symbols += 1   # (traced values exist now: calls are searched for them)
        if type(value) is int:
            self._int_names.add(self.params[index])
        return traced(value, self.params[index], self)

    def pin_places(self) -> None:
        """For a run that asked where its tensors lie (`place_read`): the replay returns a miss unless each entry
        tensor lies at the storage offset, in memory of the size, it had when recorded."""
        checks = [f"if {name}.storage_offset() != {t.storage_offset()} or {name}.untyped_storage().nbytes() != "
                  f"{t.untyped_storage().nbytes()}: return _MISS"
                  for entries in self._entry_of.values() for name, t in entries]
        self.prologue[:0] = checks
        self.constants["_MISS"] = GUARD_MISS

    def refuse(self, reason: str) -> None:
        if self.refused is None:
            where = _users_line()
            self.refused = f"{reason} ({where})" if where else reason
            self.active = False

    # -- scalars read from data -----------------------------------------------------------------------
    def guard(self, left: str, symbol: str, right: str, outcome: bool) -> None:
        """The replay must see `left symbol right` come out as `outcome` (checked before it touches data). Kept
        in one form (`s1 < 0` false is `s1 >= 0`; `0 <= s1` is `s1 >= 0`), so repeated checks are kept once."""
        if self._late and self._late.intersection(_SYMBOL.findall(f"{left} {right}")):
            self.refuse("the run's course depends on a value it read (pl.read) from data it computed")
            return
        if not outcome:
            symbol = _NEGATED[symbol]
        if _LITERAL.fullmatch(left) and not _LITERAL.fullmatch(right):
            left, symbol, right = right, _MIRRORED[symbol], left
        line = f"if not ({left} {symbol} {right}): return _MISS"
        if line in self._guard_lines:
            return
        self._guard_lines.add(line)
        if _holds_always(left, symbol, right, self._int_names):   # `(s1 + 1) * 8 - s1 * 8 == 8`: nothing to check
            return
        self.prologue.append(line)
        self.guards += 1
        self.constants["_MISS"] = GUARD_MISS

    def read_scalar(self, t: torch.Tensor, index: tuple):
        """`t[index]` as a traced number the replay reads again; None when it cannot. From an entry tensor the run
        has not written yet, the replay reads it at its start (its guards may use it); from data the run computed
        or wrote, at the same point of the run, and then the run's course must not depend on it (a guard on it
        refuses the recording)."""
        if self.refused is not None or t.dtype not in _READABLE or id(t) not in self.names:
            return None
        self._muted = True
        try:
            value = t[tuple(int.__int__(i) for i in index)].item()
        finally:
            self._muted = False
        symbol = f"s{self._symbols}"
        self._symbols += 1
        if type(value) is int:
            self._int_names.add(symbol)
        storage = storage_id(t)
        entry = next((e for e in self._entry_of.get(storage, ()) if e[1].dtype == t.dtype), None)
        if entry is None or storage in self._written or id(t) in self._moving:
            name = self.names[id(t)]
            line = _Line(f"{name}[({', '.join(code_of(i) for i in index)},)].item()", [name], True, [], [])
            line.target = symbol
            self.lines.append(line)
            self._late.add(symbol)
            return traced(value, symbol, self)
        self.place_read = True   # (the prologue reads the element at its place in the entry tensor's memory)
        constant, terms = t.storage_offset(), []
        for i, stride in zip(index, t.stride()):
            if type(i) is TracedInt:
                terms.append(i.code if stride == 1 else f"{i.code} * {stride}")
            else:
                constant += i * stride
        where = " + ".join(terms + [str(constant)] if constant or not terms else terms)
        source = self._read_sources.get((storage, t.dtype))
        if source is None:
            elements = t.untyped_storage().nbytes() // t.element_size()
            whole = elements <= READ_WHOLE_ELEMENTS
            source = self._read_sources[(storage, t.dtype)] = (f"r{len(self._read_sources)}", whole)
            flat = f"{self._const(torch.as_strided, 'f')}({entry[0]}, ({elements},), (1,), 0)"
            self.prologue.append(f"{source[0]} = {flat}.tolist()" if whole else f"{source[0]} = {flat}")
        self.prologue.append(f"{symbol} = {source[0]}[{where}]" + ("" if source[1] else ".item()"))
        return traced(value, symbol, self)

    def _from_data(self, t: torch.Tensor) -> bool:
        """Whether `t`'s contents may differ between runs: computed from an entry tensor or chance, or an outside
        tensor (kept by reference: its contents are read afresh by every replay)."""
        return storage_id(t) in self._tainted or id(t) not in self.names

    def _pin(self, traced: list) -> None:
        for v in traced:
            v.pin()

    def _guard_window(self, t: torch.Tensor, key, traced: list) -> None:
        """A window of `t` at offsets computed from data (`t[s:s + 1, :]`, `t.narrow(0, s, 4)`): guards that
        keep it inside `t` with the recorded extents, so only its offset varies between replays; values it
        cannot bound this way are pinned."""
        key = key if isinstance(key, tuple) else (key,)
        if len(key) > t.dim() or any(
                not (type(k) is slice or type(k) is int or type(k) is TracedInt) for k in key):
            return self._pin(traced)
        checks = []
        for k, n in zip(key, t.shape):
            if type(k) is slice:
                bounds = (k.start, k.stop)
                if k.step not in (None, 1) or any(type(b) not in (int, TracedInt, type(None)) for b in bounds):
                    return self._pin(traced)
                start, stop = (0 if k.start is None else k.start), (n if k.stop is None else k.stop)
                if type(start) is TracedInt or type(stop) is TracedInt:
                    a, b = untraced(start), untraced(stop)
                    lo, hi = code_of(start), code_of(stop)
                    checks += [(lo, ">=", "0", 0 <= a), (hi, ">=", lo, a <= b), (hi, "<=", str(n), b <= n),
                               (f"{hi} - {lo}", "==", str(b - a), True)]
            elif type(k) is TracedInt:
                checks += [(k.code, ">=", "0", 0 <= untraced(k)), (k.code, "<", str(n), untraced(k) < n)]
        if not all(check[3] for check in checks):   # outside when recorded: pin instead
            return self._pin(traced)
        for left, symbol, right, _ in checks:
            self.guard(left, symbol, right, True)

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refused is None and not self._muted:
            try:
                self._record(func, args, kwargs, out)
            except Refused as r:
                self.refuse(str(r))
        return out

    # -- recording ------------------------------------------------------------------------------------
    def _record(self, func, args, kwargs, out) -> None:
        name = getattr(func, "__name__", "") or repr(func)
        tensors_in = _tensors(args)
        if kwargs:
            _tensors(kwargs, tensors_in)
        traced = _traced(args, []) if self._symbols else []
        if kwargs and self._symbols:
            _traced(tuple(kwargs.values()), traced)
        if name in _DATA_READS:
            if any(self._from_data(t) for t in tensors_in):
                raise Refused(f"the run reads tensor data into Python (`{name}`), so its course may depend on data")
            return self._pin(traced)   # data computed from constants only: the same value every run
        if (name in _DATA_SHAPED or (name == "where" and len(args) == 1) or (
                name == "__getitem__" and any(t.dtype in (torch.bool, torch.uint8) for t in tensors_in[1:]))) and (
                traced or any(self._from_data(t) for t in tensors_in)):
            raise Refused(f"`{name}` makes a result whose shape depends on data")   # (on constants: static)
        if isinstance(out, _METADATA_TYPES) or (name in _METADATA and not _tensors(out)):
            if name in ("storage_offset", "data_ptr", "untyped_storage"):
                self.place_read = True
            if self._moving and name in ("storage_offset", "data_ptr") and any(
                    id(t) in self._moving for t in tensors_in):
                raise Refused(f"the run reads the place of a window at offsets read from data (`{name}`)")
            return self._pin(traced)
        if not isinstance(out, (torch.Tensor, tuple, list)) and out is not None:
            raise Refused(f"`{name}` returned a {type(out).__name__}, which the trace cannot follow")
        if traced and name in _WINDOWS and tensors_in and args and args[0] is tensors_in[0]:
            self._guard_window(tensors_in[0], args[1] if name != "narrow" else
                               (slice(None),) * untraced(args[1]) + (slice(args[2], args[2] + args[3]),), traced)
        if func is _GETITEM and len(args) == 2 and not kwargs:   # subscripts as subscripts: Python's fast path
            call = f"{self._render(args[0])}[{self._render_key(args[1])}]"
        elif func is _SETITEM and len(args) == 3 and not kwargs:
            call = f"{self._render(args[0])}[{self._render_key(args[1])}] = {self._render(args[2])}"
        else:
            call = f"{self._const(func, re.sub(r'[^A-Za-z0-9]', '', name) + '_')}({self._args(args, kwargs)})"
        reads = [self.names[id(t)] for t in tensors_in]
        tainted = bool(traced) or name in _RANDOM or any(storage_id(t) in self._tainted for t in tensors_in)
        mutates = (not name.startswith("__") and name.endswith("_")) or name in _IN_PLACE_DUNDERS or (
            "out" in kwargs or kwargs.get("inplace") is True)
        written = (tensors_in[:1] + _tensors(kwargs.get("out"))) if mutates else []
        if mutates and tainted:
            self._tainted.update(storage_id(t) for t in written)
        if mutates:
            self._written.update(storage_id(t) for t in written)
        effect = mutates or name in _RANDOM
        line = _Line(call, reads, effect, [self.names[id(t)] for t in written], [storage_id(t) for t in written])
        line.tainted = tainted
        if func is _GETITEM and len(args) == 2 and not kwargs and isinstance(out, torch.Tensor) and out._is_view():
            line.kind = "window"
        elif func is _COPY and len(args) == 2 and not kwargs and len(tensors_in) == 2:
            line.kind = "copy"
        if isinstance(out, torch.Tensor):
            if id(out) in self.names:   # an in-place method returning its own tensor, or a no-op `.to()`
                if effect:
                    self.lines.append(line)
                return
            line.target = self._define(out, tainted)
            line.fresh = storage_id(out) not in {storage_id(t) for t in tensors_in}
            self.lines.append(line)
            if traced or self._moving:
                self._follow_place(name, out, tensors_in, traced, args)
            return
        if out is None:
            line.effect = True
            self.lines.append(line)
            return
        if not all(isinstance(o, torch.Tensor) or o is None for o in out):
            raise Refused(f"`{name}` returned a {type(out).__name__} the trace cannot follow")
        line.target, line.effect = f"t{len(self.lines)}", True
        self.lines.append(line)
        for i, o in enumerate(out):
            if isinstance(o, torch.Tensor) and id(o) not in self.names:
                part = _Line(f"{line.target}[{i}]", [line.target], False, [], [])
                part.tainted = tainted
                part.target = self._define(o, tainted)
                self.lines.append(part)
                if traced or self._moving:
                    self._follow_place(name, o, tensors_in, traced, args)

    def _follow_place(self, name: str, out: torch.Tensor, tensors_in: list, traced: list, args: tuple) -> None:
        """Shapes stay static: traced values a call takes as sizes (`torch.zeros(s, 8)`, a reshape) are pinned, so
        the replay makes the recorded shape or misses (a value from computed data cannot be checked in time: its pin
        refuses the recording). Values taken as operands or contents (`x * s`, `torch.tensor(s)`,
        `torch.full(size, s)`) leave the shape alone, and a window's extents are guarded, so only its offset moves:
        which results have such an offset (`_moving`), views of moving windows included."""
        sized = traced and name not in _WINDOWS and name not in _SCALAR_OPERANDS and name not in _CONTENTS and not (
            name == "full" and args and not _traced((args[0],), []))
        if sized:
            self._pin(traced)
        elif (traced and name in _WINDOWS) or any(
                id(t) in self._moving and storage_id(t) == storage_id(out) for t in tensors_in):
            self._moving.add(id(out))

    def _define(self, t: torch.Tensor, tainted: bool) -> str:
        name = f"v{len(self.names)}"
        self.names[id(t)] = name
        self.made[name] = t
        storage = self.storage_of[name] = storage_id(t)
        if storage not in self._held:
            self._held.add(storage)
            self._held_bytes += t.untyped_storage().nbytes()
            if self._held_bytes > MAX_HELD_BYTES:
                raise Refused(f"recording would hold more than {MAX_HELD_BYTES / 2**30:g} GiB of intermediate tensors")
        self._alive.append(t)
        if tainted:
            self._tainted.add(storage_id(t))
        return name

    def _const(self, obj, prefix: str) -> str:
        name = self._const_ids.get(id(obj))
        if name is None:
            name = self._const_ids[id(obj)] = f"{prefix}{len(self.constants)}"
            self.constants[name] = obj
            self._alive.append(obj)
        return name

    def _args(self, args, kwargs) -> str:
        parts = [self._render(a) for a in args] + [f"{k}={self._render(v)}" for k, v in kwargs.items()]
        return ", ".join(parts)

    def _render(self, value) -> str:
        if type(value) in TRACED:
            return value.code
        if isinstance(value, torch.Tensor):
            name = self.names.get(id(value))
            if name is None:   # made outside the run: kept by reference
                if storage_id(value) in self._input_storages:
                    raise Refused("an outside tensor shares memory with an entry tensor")
                self._tainted.add(storage_id(value))
                name = self.names[id(value)] = self._const(value, "k")
                self.storage_of[name] = storage_id(value)
            return name
        if isinstance(value, _SIMPLE):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else self._const(value, "k")
        if isinstance(value, slice):
            return self._literal(value, f"slice({self._render(value.start)}, {self._render(value.stop)}, "
                                        f"{self._render(value.step)})")
        if value is Ellipsis:
            return "..."
        if type(value) is tuple:
            inner = ", ".join(self._render(v) for v in value)
            return self._literal(value, f"({inner},)" if value else "()")
        if type(value) is list:
            return "[" + ", ".join(self._render(v) for v in value) + "]"
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size,
                              torch.Generator, complex, types.FunctionType, types.BuiltinFunctionType)):
            return self._const(value, "k")
        raise Refused(f"an argument of type {type(value).__name__} cannot be written into the trace")

    def _render_key(self, key) -> str:
        """A subscript's key in subscript syntax (`v3[s1:s1 + 1, :]`; no slice objects built by calls)."""
        if type(key) is slice and all(type(b) in _KEY_BOUNDS for b in (key.start, key.stop, key.step)):
            bounds = ["" if b is None else self._render(b) for b in (key.start, key.stop, key.step)]
            return ":".join(bounds if key.step is not None else bounds[:2])
        if type(key) is tuple and key:
            return ", ".join(self._render_key(k) for k in key) + ("," if len(key) == 1 else "")
        return self._render(key)

    def _literal(self, value, code: str) -> str:
        """An immutable argument with no tensor in it (an index tuple, a slice) is built once, not per call."""
        if _NAME.search(code):
            return code
        name = self._literals.get(code)
        if name is None:
            name = self._literals[code] = self._const(value, "k")
        return name

    # -- code -----------------------------------------------------------------------------------------
    def source(self, results: list[str], fn_name: str = "replay") -> str:
        """The trace as one function of the entry tensors, returning the tensors named in `results`.

        Two clean-ups: a call repeating an earlier one (same function, same arguments, their memory unchanged
        since) reuses its result, unless either result is later written; a call whose result nothing needs and
        that changes nothing is left out."""
        lines = self._fold(_dedupe(self.lines, self.storage_of), set(results))
        needed = set(results)
        keep = []
        for line in reversed(lines):
            if line.effect or line.target in needed:
                keep.append(line)
                needed.update(line.reads)
        keep = _assign_windows(keep[::-1], set(results))
        body = [f"{line.target} = {line.call}" if line.target else line.call for line in keep]
        self.calls = len(body)
        folded = [f"{n} {list(self.made[n].shape)} {self.made[n].dtype}" for n in sorted(needed & self.made.keys())
                  if n in self.constants]
        if folded:
            body.insert(0, "# tensors computed from constants when recorded, kept: " + ", ".join(folded))
        body[:0] = self.prologue
        named = set(re.findall(r"\bk\d+\b", "\n".join(body)))
        used = sorted((n for n in self._literals.values() if n in named), key=lambda n: int(n[1:]))
        body[:0] = [f"# {n} = {self.constants[n]!r}" for n in used]
        body.append(f"return ({', '.join(results)}{',' if results else ''})")
        return _hoist_common(f"def {fn_name}({', '.join(self.params)}):\n" + "\n".join("    " + line for line in body)
                             + "\n")

    def _fold(self, lines: list[_Line], results: set[str]) -> list[_Line]:
        """Constants: a call computed from literals and constants alone (nothing from an entry tensor, an outside
        tensor or chance), whose memory nothing writes later, gives the same tensor every run: the recorded one
        is kept (as a global of the replay function) instead of the call. Not for the memory of returned tensors
        (views too): the caller may write those."""
        keep_fresh = {s for line in lines for s in line.written_storages} | {
            self.storage_of[r] for r in results if r in self.storage_of}   # written, or returned (also as a view)
        out = []
        for line in lines:
            target = line.target
            if (target is not None and not line.effect and not line.tainted and target in self.made
                    and self.storage_of[target] not in keep_fresh):
                self.constants[target] = self.made[target]
                continue
            out.append(line)
        return out

    def name_of(self, t: torch.Tensor) -> str | None:
        return self.names.get(id(t))


class _Line:
    """One recorded call: `target = call`, or `call` alone for an effect with no new tensor."""
    __slots__ = ("call", "reads", "effect", "written", "written_storages", "target", "fresh", "tainted", "kind")

    def __init__(self, call: str, reads: list[str], effect: bool, written: list[str], written_storages: list[int]):
        self.call, self.reads, self.effect = call, reads, effect
        self.kind = ""       # "window": `call` is `t[key]` (a view); "copy": `copy_(dst, src)` (see _assign_windows)
        self.written, self.written_storages = written, written_storages   # what a mutating call writes
        self.target: str | None = None
        self.fresh = False   # the result has memory of its own (not a view of an argument)
        self.tainted = True  # the result may depend on an entry tensor, an outside tensor or chance


_NAME = re.compile(r"\b[avts]\d+\b")


def _assign_windows(lines: list[_Line], results: set) -> list[_Line]:
    """`v4 = a3[k]` then `copy_(v4, v3)`, with v4 used nowhere else, becomes `a3[k] = v3`: torch's subscript
    assignment copies into the same view (one call instead of two; the same bits)."""
    readers: dict[str, int] = {}
    for line in lines:
        for name in line.reads:
            readers[name] = readers.get(name, 0) + 1
    windows = {line.target: line for line in lines if line.kind == "window" and line.target not in results
               and readers.get(line.target) == 1}
    merged = set()
    for line in lines:
        if line.kind == "copy" and line.reads[0] in windows and line.reads[1] != line.reads[0]:
            window = windows[line.reads[0]]
            line.call = f"{window.call} = {line.reads[1]}"
            line.reads = window.reads + line.reads[1:]
            merged.add(id(window))
    return [line for line in lines if id(line) not in merged]


def _dedupe(lines: list[_Line], storage_of: dict[str, int]) -> list[_Line]:
    """Common subexpressions: a pure call equal to an earlier one, over memory not written in between, reuses
    the earlier result. Results that are written later (by name or, for fresh memory, through any view) keep
    their own call: sharing them would leak one's writes into the other."""
    written_names = {n for line in lines for n in line.written}
    written_storages = {s for line in lines for s in line.written_storages}
    version: dict[int, int] = {}
    seen: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    out = []
    for line in lines:
        if alias:
            line.call = _NAME.sub(lambda m: alias.get(m.group(0), m.group(0)), line.call)
            line.reads = [alias.get(r, r) for r in line.reads]
        for s in line.written_storages:
            version[s] = version.get(s, 0) + 1
        target = line.target
        if target is not None and target in storage_of:
            shareable = (not line.effect and target not in written_names
                         and not (line.fresh and storage_of[target] in written_storages))
            if shareable:
                key = (line.call, tuple(version.get(storage_of.get(r), 0) for r in line.reads))
                earlier = seen.get(key)
                if earlier is not None:
                    alias[target] = earlier
                    continue
                seen[key] = target
        out.append(line)
    return out


_TORCH_DIR = os.path.dirname(torch.__file__)


def _users_line() -> str | None:
    """`file:line` of the innermost frame of the user's code (not pypto-rt's, not torch's) on this stack."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (is_internal_file(name) or name.startswith(_TORCH_DIR) or name.startswith("<")):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _traced(value, out: list) -> list:
    """The traced numbers in call arguments (nested tuples, lists, slices), in order."""
    for v in value:
        kind = type(v)
        if kind in TRACED:
            out.append(v)
        elif kind is slice:
            _traced((v.start, v.stop, v.step), out)
        elif kind is tuple or kind is list:
            _traced(v, out)
    return out


def storage_id(t: torch.Tensor) -> int:
    """The identity of a tensor's memory (an empty one has none: its own id, negated)."""
    return t.untyped_storage().data_ptr() or -id(t)


def _tensors(value, out: list | None = None) -> list:
    """The tensors in `value` (nested tuples, lists and dicts), in order."""
    out = [] if out is None else out
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif isinstance(v, (tuple, list, dict)):
                _tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, out)
    return out


_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
HOIST_LINES = 400   # replays longer than this keep their arithmetic in place (see _hoist_common)
_HOISTABLE_OPS = (ast.Add, ast.Sub, ast.Mult)   # integer arithmetic that cannot raise: safe before a guard
_COMPARE = {"==": lambda d: d == 0, "!=": lambda d: d != 0, "<": lambda d: d < 0, "<=": lambda d: d <= 0,
            ">": lambda d: d > 0, ">=": lambda d: d >= 0}


def _holds_always(left: str, symbol: str, right: str, int_names: set) -> bool:
    """Whether `left symbol right` holds for any values of its names: both sides are +, -, * of integer names and
    integer constants (polynomials with integer values, exact), and their difference is the same constant at
    several random points (a nonzero polynomial is zero at random points with negligible chance)."""
    occurrences = _IDENTIFIER.findall(f"{left} {right}")
    if any(occurrences.count(n) == 1 for n in set(occurrences)):
        return False   # (quick: a name used once cannot cancel out; most guards are like `s3 >= 0`)
    try:
        diff = ast.parse(f"({left}) - ({right})", mode="eval").body
    except SyntaxError:
        return False
    names = set()
    for node in ast.walk(diff):
        if isinstance(node, ast.Name):
            if node.id not in int_names:
                return False
            names.add(node.id)
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return False
        elif not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.expr_context)) or (
                isinstance(node, ast.operator) and not isinstance(node, _HOISTABLE_OPS)) or (
                isinstance(node, ast.unaryop) and not isinstance(node, ast.USub)):
            return False
    code = compile(ast.Expression(diff), "<guard>", "eval")
    rng = random.Random(len(left) + len(right))
    values = {eval(code, {"__builtins__": {}}, {n: rng.randint(-10**9, 10**9) for n in names}) for _ in range(4)}
    return len(values) == 1 and _COMPARE[symbol](values.pop())


def _hoist_common(source: str) -> str:
    """Arithmetic on numbers (`(s1 + 1) * 8`: offsets computed from a value read from data, guarded and used in
    windows) computed more than once is computed once, into `c<n>`, just before the first statement that uses it.
    Only +, - and * of names and constants (no call, no division: nothing that could raise before a guard); a
    name assigned more than once in the function keeps its expressions where they are. Comments are kept. Linear
    in the function's size, but Python's ast is slow: a function beyond `HOIST_LINES` lines (a block making
    thousands of calls, whose own run dwarfs the arithmetic) is left as it is."""
    if source.count("\n") > HOIST_LINES:
        return source
    tree = ast.parse(source)
    fn = tree.body[0]
    assigned: dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            assigned[node.id] = assigned.get(node.id, 0) + 1
    codes: dict[int, str] = {}     # id(BinOp node) -> its canonical text, for the pure-arithmetic ones
    counts: dict[str, int] = {}
    first: dict[str, tuple] = {}   # canonical text -> (index of the first statement using it, a node of it)
    for index, stmt in enumerate(fn.body):
        for node in ast.walk(stmt):
            if isinstance(node, ast.BinOp):
                code = _arithmetic_code(node, assigned, codes)
                if code is not None:
                    counts[code] = counts.get(code, 0) + 1
                    first.setdefault(code, (index, node))
    common = [c for c, n in counts.items() if n > 1]
    if not common:
        return source
    names = {code: f"c{i}" for i, code in enumerate(sorted(common, key=len, reverse=True))}   # outermost first

    class Replace(ast.NodeTransformer):
        def __init__(self, skip: str | None = None):
            self.skip = skip

        def visit_BinOp(self, node):
            code = codes.get(id(node))
            if code in names and code != self.skip:
                return ast.Name(names[code], ast.Load())
            return self.generic_visit(node)

    hoisted: dict[int, list] = {}
    for code in sorted(common, key=len):   # an inner expression (a part of an outer one) first
        index, node = first[code]
        value = Replace(skip=code).visit(ast.BinOp(node.left, node.op, node.right))
        hoisted.setdefault(index, []).append(ast.Assign([ast.Name(names[code], ast.Store())], value))
    body = [Replace().visit(stmt) for stmt in fn.body]
    out = []
    for index, stmt in enumerate(body):
        out.extend(hoisted.get(index, ()))
        out.append(stmt)
    fn.body = out
    comments = [line for line in source.splitlines()[1:] if line.lstrip().startswith("#")]
    text = ast.unparse(ast.fix_missing_locations(tree)).splitlines()
    return _GUARD_SPLIT.sub(r"\1 return _MISS", "\n".join(text[:1] + comments + text[1:]) + "\n")


_GUARD_SPLIT = re.compile(r"^(\s*if not .*:)\n\s*return _MISS$", re.M)   # a guard stays on one line
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


def _arithmetic_code(node, assigned: dict, codes: dict) -> str | None:
    """The canonical text of a +, -, * expression of names assigned at most once (or parameters) and numeric
    constants, memoised in `codes` by node; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id if assigned.get(node.id, 0) <= 1 else None
    if isinstance(node, ast.Constant):
        return repr(node.value) if type(node.value) in (int, float) else None
    if not isinstance(node, ast.BinOp) or type(node.op) not in _OPERATORS:
        return None
    known = codes.get(id(node))
    if known is not None:
        return known
    left = _arithmetic_code(node.left, assigned, codes)
    right = _arithmetic_code(node.right, assigned, codes) if left is not None else None
    if right is None:
        return None
    code = codes[id(node)] = f"({left} {_OPERATORS[type(node.op)]} {right})"
    return code


def compile_trace(source: str, constants: dict, file: str = "<pypto-rt replay>"):
    """The function `source` defines, with `constants` as its globals."""
    namespace = dict(constants)
    namespace["__builtins__"] = {"slice": slice}
    exec(compile(source, file, "exec"), namespace)
    return next(v for k, v in namespace.items() if isinstance(v, types.FunctionType) and k not in constants)
