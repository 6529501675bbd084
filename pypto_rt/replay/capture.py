"""Recording the torch calls of a run as straight-line Python, to run again without the runtime around them.

`Recorder` is a torch function mode: on the thread that enters it, every torch call (functions, tensor methods,
factories, property reads) passes through it. Calls that make or change tensors become lines of a function,
`v7 = sum_3(v2, dim=-1, keepdim=True)`; the run's entry tensors are its parameters `a0, a1, ...`, the
functions and constants it uses are its globals.

Numbers read from data: `pl.read` asks `read_scalar` and gets a `TracedInt` or `TracedFloat`
(replay.scalars). When the element lies in an entry tensor the run has not written yet, the function starts
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
  memory with an entry tensor (a view made before the run; a window excepted, see below), or an op that declares
  itself non-replayable (`pypto_rt.ops.recording.refuse`: communication on the host, printing).
Communication blocks: orchestration runs each block of a communication task *signalling* (its `pld` ops recorded as
calls of their effects, replay.comm_block) or, once that was refused for its kernel, hands it to `opaque_block`,
which runs it muted and records it as one call of its kernel (replay.opaque). Windows (views of
`pld.alloc_window_buffer`, entry or outside tensors) are *volatile*: peers write them at any time, so a number read
from one is read where the run read it (never in the prologue, and a guard on it refuses the recording, as for
computed data), and no call reading one shares another's result (passes); nothing is assumed about which window
views share memory.
The op library calls torch only through its public API (no `torch.ops.aten`, no `torch._C`: those bypass the
mode; tests/replay/test_replay.py checks). Metadata reads (`.shape`, `.dim()`, `.stride()`, `untyped_storage()`)
are not recorded: under one specialisation they give the same answers every time. Outside tensors (module
constants, op-library caches) are kept by reference.
"""
from __future__ import annotations

import math
import re
import types

import torch
from torch.overrides import TorchFunctionMode

from pypto_rt.collective import process
from pypto_rt.ops import recording
from pypto_rt.replay import comm_block, opaque, passes, windows
from pypto_rt.replay.calls import (COPY, CONTENTS, DATA_READS, DATA_SHAPED, GETITEM, IN_PLACE_DUNDERS,
                                   KEY_BOUNDS, METADATA, METADATA_TYPES, RANDOM, READABLE, SCALAR_OPERANDS,
                                   SETITEM, SIMPLE, WINDOWS, Refused, storage_id, tensors_of, traced_of,
                                   users_line)
from pypto_rt.replay.guards import GUARD_MISS, Guard, holds_always
from pypto_rt.replay.late_rows import LateRows
from pypto_rt.replay.records import Call, Code, Lit, Ref, Sym, has_names, joined, text
from pypto_rt.replay.policy import ReplayPolicy, current_policy
from pypto_rt.replay.scalars import TRACED, TracedInt, code_of, traced, untraced



class Recorder(TorchFunctionMode):
    """Use as `with Recorder(entry_tensors) as rec:` around the run, on the thread that runs all of it."""

    def __init__(self, inputs: list[torch.Tensor], policy: ReplayPolicy | None = None,
                 opaque_kernels: frozenset = frozenset()):
        """`policy`: its limits (`max_held_bytes`, `read_whole_elements`, `hoist_lines`); the one in force here
        by default. `opaque_kernels`: keys of kernels whose blocks orchestration records as opaque calls."""
        super().__init__()
        self.policy = policy if policy is not None else current_policy()
        self.refused: str | None = None
        self.opaque_kernels = opaque_kernels
        self.block = None                                    # key of the kernel whose block runs now (recorded)
        self.escaped: dict = {}                              # key -> why the recording was refused in its block
        self.block_guards: set = set()                       # keys of kernels whose blocks made guards
        self.recorded: list[Call] = []                      # the calls, as records (see replay.records)
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
        self.prologue: list = []                            # statements (text) and Guards, in order
        self.guards = 0
        self._guards_seen: set[Guard] = set()
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
        self.opaque_calls = 0                                # blocks recorded as one call (replay.opaque)
        self.communicates = False                            # ... communication blocks among them
        self.volatile: set[int] = set()                      # window storages: peers write them at any time
        self.signalling = False                              # a signalling block runs now (replay.comm_block)
        self.rows = LateRows(self)                           # tensors whose row count follows a late value
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
                if process.window_of(t) is not None:
                    self.volatile.add(storage_id(t))

    def __enter__(self):
        recording.push(self)
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        recording.pop()
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

    def opaque_block(self, call, inputs: tuple, block: int, written, communicates: bool) -> object:
        """Run block `block` of a kernel as `call(block, *inputs)` and record it as one opaque call (replay.opaque);
        `written`: the indices of the inputs it writes; `communicates`: a communication task's. Its return
        value."""
        self.communicates |= communicates
        return opaque.record_block(self, call, inputs, block, written)

    def communicate(self, reason: str, effect, args: tuple):
        """A `pld` op: recorded as one call of its effect in a signalling block, refused elsewhere
        (replay.comm_block)."""
        return comm_block.communicate(self, reason, effect, args)

    def refuse(self, reason: str) -> None:
        """The recording cannot be replayed; refused inside a block (`block`), the next recording may take that
        kernel's blocks as opaque calls (`escaped`, see replay.entry)."""
        if self.refused is None:
            where = users_line()
            self.refused = f"{reason} ({where})" if where else reason
            self.active = False
            if self.block is not None:
                self.escaped[self.block] = self.refused

    # -- scalars read from data -----------------------------------------------------------------------
    def guard(self, left, symbol: str, right, outcome: bool) -> None:
        """The replay must see `left symbol right` (numbers, traced or plain) come out as `outcome`, checked before
        it touches data (a Guard, in one form: repeated checks are kept once)."""
        guard = Guard.of(left, symbol, right, outcome)
        if self._late and not self._late.isdisjoint(guard.reads):
            if holds_always(guard, self._int_names):   # `c == c` of a late row count (replay.late_rows)
                return
            self.refuse("the run's course depends on a value it read (pl.read) from data it computed or from a "
                        "window (peers write windows at any time)")
            return
        if guard in self._guards_seen:
            return
        self._guards_seen.add(guard)
        if holds_always(guard, self._int_names):   # `(s1 + 1) * 8 - s1 * 8 == 8`: nothing to check
            return
        self.prologue.append(guard)
        self.guards += 1
        self.constants["_MISS"] = GUARD_MISS
        if self.block is not None:
            self.block_guards.add(self.block)

    def read_scalar(self, t: torch.Tensor, index: tuple):
        """`t[index]` as a traced number the replay reads again; None when it cannot. From an entry tensor the run
        has not written yet, the replay reads it at its start (its guards may use it); from data the run computed
        or wrote, at the same point of the run, and then the run's course must not depend on it (a guard on it
        refuses the recording)."""
        if self.refused is not None or t.dtype not in READABLE or id(t) not in self.names:
            return None
        self._muted = True
        try:
            value = t[tuple(int.__int__(i) for i in index)].item()
        finally:
            self._muted = False
        storage = storage_id(t)
        entry = next((e for e in self._entry_of.get(storage, ()) if e[1].dtype == t.dtype), None)
        if entry is None or storage in self._written or id(t) in self._moving or storage in self.volatile:
            name = self.names[id(t)]
            code = (Ref(name), "[(", Sym(", ".join(code_of(i) for i in index)), ",)].item()")
            return self.computed_number(value, code, [name])
        symbol = f"s{self._symbols}"
        self._symbols += 1
        if type(value) is int:
            self._int_names.add(symbol)
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
            whole = elements <= self.policy.read_whole_elements
            source = self._read_sources[(storage, t.dtype)] = (f"r{len(self._read_sources)}", whole)
            flat = f"{self._const(torch.as_strided, 'f')}({entry[0]}, ({elements},), (1,), 0)"
            self.prologue.append(f"{source[0]} = {flat}.tolist()" if whole else f"{source[0]} = {flat}")
        self.prologue.append(f"{symbol} = {source[0]}[{where}]" + ("" if source[1] else ".item()"))
        return traced(value, symbol, self)

    def computed_number(self, value, code: tuple, reads: list[str]):
        """`value`, which the replay computes with `code` (tokens) from tensors `reads` at this point of the run, as
        a traced number: what uses it stays code, and a guard on it refuses (it comes too late)."""
        symbol = f"s{self._symbols}"
        self._symbols += 1
        if type(value) is int:
            self._int_names.add(symbol)
        self.recorded.append(Call(code, reads, True, out=symbol, kind="number"))
        self._late.add(symbol)
        return traced(value, symbol, self)

    def fixed(self, t) -> bool:   # (ops.recording.fixed)
        return self.refused is None and isinstance(t, torch.Tensor) and not self._from_data(t)

    def mute(self, muted: bool) -> bool:   # (ops.recording.unrecorded) nothing is recorded while muted; was it?
        was, self._muted = self._muted, muted
        return was

    def _from_data(self, t: torch.Tensor) -> bool:
        """Whether `t`'s contents may differ between runs: computed from an entry tensor or chance, or an outside
        tensor (kept by reference: its contents are read afresh by every replay)."""
        return storage_id(t) in self._tainted or id(t) not in self.names

    def _pin(self, traced: list) -> None:
        for v in traced:
            v.pin()

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        answer = out   # what the run sees: a marked tensor's metadata as its traced row count (replay.late_rows)
        if self.refused is None and not self._muted:
            try:
                if self.rows and args and not isinstance(out, torch.Tensor) and self.rows.of(args[0]) is not None:
                    answer = self.rows.answer(getattr(func, "__name__", ""), args, out,
                                              getattr(getattr(func, "__self__", None), "__name__", ""))
                self._record(func, args, kwargs, out)
            except Refused as r:
                self.refuse(str(r))
        return answer

    # -- recording ------------------------------------------------------------------------------------
    def _record(self, func, args, kwargs, out) -> None:
        name = getattr(func, "__name__", "") or repr(func)
        tensors_in = tensors_of(args)
        if kwargs:
            tensors_of(kwargs, tensors_in)
        traced = traced_of(args, []) if self._symbols else []
        if kwargs and self._symbols:
            traced_of(tuple(kwargs.values()), traced)
        if self._screened(name, args, out, tensors_in, traced):
            return
        window_rows = None   # (a window's row count that follows a late value: replay.late_rows)
        if traced and name in WINDOWS and tensors_in and args and args[0] is tensors_in[0]:
            window_rows = windows.guard_window(self, tensors_in[0], args[1] if name != "narrow" else (
                slice(None),) * untraced(args[1]) + (slice(args[2], args[2] + args[3]),), traced)
        sizes_follow = self.rows.follow(name, args, kwargs, out, window_rows) \
            if self.rows or window_rows is not None else False
        line = self._line(func, name, args, kwargs, out, tensors_in, traced)
        if isinstance(out, torch.Tensor):
            if id(out) in self.names:   # an in-place method returning its own tensor, or a no-op `.to()`
                if line.effect:
                    self.recorded.append(line)
                return
            line.out = self._define(out, line.tainted)
            line.fresh = storage_id(out) not in {storage_id(t) for t in tensors_in}
            self.recorded.append(line)
            if traced or self._moving:
                self._follow_place(name, out, tensors_in, traced, args, sizes_follow)
        elif out is None:
            line.effect = True
            self.recorded.append(line)
        else:
            self._record_parts(line, name, out, tensors_in, traced, args)

    def _screened(self, name: str, args, out, tensors_in: list, traced: list) -> bool:
        """Whether the call is dealt with before it becomes a line: a read of data or metadata (nothing to
        record; numbers in it pinned), or a call the trace cannot follow (raises Refused)."""
        if name in DATA_READS:
            if any(self._from_data(t) for t in tensors_in):
                raise Refused(f"the run reads tensor data into Python (`{name}`), so its course may depend on data")
            self._pin(traced)   # data computed from constants only: the same value every run
            return True
        if (name in DATA_SHAPED or (name == "where" and len(args) == 1) or (
                name == "__getitem__" and any(t.dtype in (torch.bool, torch.uint8) for t in tensors_in[1:]))) and (
                traced or any(self._from_data(t) for t in tensors_in)):
            raise Refused(f"`{name}` makes a result whose shape depends on data")   # (on constants: static)
        if isinstance(out, METADATA_TYPES) or (name in METADATA and not tensors_of(out)):
            if name in ("storage_offset", "data_ptr", "untyped_storage"):
                self.place_read = True
            if self._moving and name in ("storage_offset", "data_ptr") and any(
                    id(t) in self._moving for t in tensors_in):
                raise Refused(f"the run reads the place of a window at offsets read from data (`{name}`)")
            self._pin(traced)
            return True
        if not isinstance(out, (torch.Tensor, tuple, list)) and out is not None:
            raise Refused(f"`{name}` returned a {type(out).__name__}, which the trace cannot follow")
        return False

    def _line(self, func, name: str, args, kwargs, out, tensors_in: list, traced: list) -> Call:
        """The call as a line (its target not yet named); storages it writes noted as written (and tainted)."""
        if func is GETITEM and len(args) == 2 and not kwargs:   # subscripts as subscripts: Python's fast path
            code = self._render(args[0]) + ("[",) + self._render_key(args[1]) + ("]",)
        elif func is SETITEM and len(args) == 3 and not kwargs:
            code = self._render(args[0]) + ("[",) + self._render_key(args[1]) + ("] = ",) + self._render(args[2])
        else:
            code = (self._const(func, re.sub(r"[^A-Za-z0-9]", "", name) + "_"), "(") + self._args(args, kwargs) + (")",)
        reads = [self.names[id(t)] for t in tensors_in]
        tainted = bool(traced) or name in RANDOM or any(storage_id(t) in self._tainted for t in tensors_in)
        mutates = (not name.startswith("__") and name.endswith("_")) or name in IN_PLACE_DUNDERS or (
            "out" in kwargs or kwargs.get("inplace") is True)
        written = (tensors_in[:1] + tensors_of(kwargs.get("out"))) if mutates else []
        if mutates and tainted:
            self._tainted.update(storage_id(t) for t in written)
        if mutates:
            self._written.update(storage_id(t) for t in written)
        effect = mutates or name in RANDOM
        line = Call(code, reads, effect, [self.names[id(t)] for t in written], [storage_id(t) for t in written],
                    tainted=tainted)
        if func is GETITEM and len(args) == 2 and not kwargs and isinstance(out, torch.Tensor) and out._is_view():
            line.kind = "window"
            line.whole = not traced and type(args[0]) is torch.Tensor and (out.shape, out.stride(), out.storage_offset(
            )) == (args[0].shape, args[0].stride(), args[0].storage_offset())   # (passes: `_whole_windows`)
        elif func is COPY and len(args) == 2 and not kwargs and len(tensors_in) == 2:
            line.kind = "copy"
        elif func is torch._assert_async:
            line.kind = "check"
        return line

    def _record_parts(self, line: Call, name: str, out, tensors_in: list, traced: list, args) -> None:
        """A call returning a tuple or list of tensors: one line for the call, one per new tensor in it."""
        if not all(isinstance(o, torch.Tensor) or o is None for o in out):
            raise Refused(f"`{name}` returned a {type(out).__name__} the trace cannot follow")
        if not line.effect:
            line.kind = "parts"     # pure (sort, topk, max over a dim): equal calls may share it
        line.out, line.effect = f"t{len(self.recorded)}", True
        self.recorded.append(line)
        for i, o in enumerate(out):
            if isinstance(o, torch.Tensor) and id(o) not in self.names:
                part = Call((Ref(line.out), f"[{i}]"), [line.out], False, tainted=line.tainted)
                part.out = self._define(o, line.tainted)
                self.recorded.append(part)
                if traced or self._moving:
                    self._follow_place(name, o, tensors_in, traced, args)

    def _follow_place(self, name: str, out: torch.Tensor, tensors_in: list, traced: list, args: tuple,
                      sizes_follow: bool = False) -> None:
        """Shapes stay static: traced values a call takes as sizes (`torch.zeros(s, 8)`, a reshape) are pinned, so
        the replay makes the recorded shape or misses (a value from computed data cannot be checked in time: its pin
        refuses the recording). Values taken as operands or contents (`x * s`, `torch.tensor(s)`,
        `torch.full(size, s)`) leave the shape alone, and a window's extents are guarded, so only its offset moves:
        which results have such an offset (`_moving`), views of moving windows included. `sizes_follow`: the
        traced sizes are a row count that follows data, which the result's rows follow (replay.late_rows)."""
        sized = traced and not sizes_follow and name not in WINDOWS and name not in SCALAR_OPERANDS and \
            name not in CONTENTS and not (
            name == "full" and args and not traced_of((args[0],), []))
        if sized:
            self._pin(traced)
        elif (traced and name in WINDOWS) or any(
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
            limit = self.policy.max_held_bytes
            if self._held_bytes > limit:
                raise Refused(f"recording would hold more than {limit / 2**30:g} GiB of intermediate tensors")
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

    def _args(self, args, kwargs) -> Code:
        parts = [self._render(a) for a in args] + [(f"{k}=",) + self._render(v) for k, v in kwargs.items()]
        return joined(parts)

    def _render(self, value) -> Code:
        """`value` as code (tokens): a tensor by its name, a number read from data by its code, a literal."""
        if type(value) in TRACED:
            return (Sym(value.code),)
        if isinstance(value, torch.Tensor):
            name = self.names.get(id(value))
            if name is None:   # made outside the run: kept by reference
                window = process.window_of(value) is not None
                if storage_id(value) in self._input_storages and not window:   # (windows: nothing is assumed)
                    raise Refused("an outside tensor shares memory with an entry tensor")
                if window:
                    self.volatile.add(storage_id(value))
                self._tainted.add(storage_id(value))
                name = self.names[id(value)] = self._const(value, "k")
                self.storage_of[name] = storage_id(value)
            return (Ref(name),)
        if isinstance(value, SIMPLE):
            return (repr(value),)
        if isinstance(value, float):
            return (repr(value) if math.isfinite(value) else self._const(value, "k"),)
        if isinstance(value, slice):
            bounds = [self._render(value.start), self._render(value.stop), self._render(value.step)]
            return self._literal(value, ("slice(",) + joined(bounds) + (")",))
        if value is Ellipsis:
            return ("...",)
        if type(value) is tuple or (type(value) is torch.Size and traced_of(value, [])):
            inner = joined([self._render(v) for v in value])
            return self._literal(value, ("(",) + inner + (",)",) if value else ("()",))
        if type(value) is list:
            return ("[",) + joined([self._render(v) for v in value]) + ("]",)
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size,
                              torch.Generator, complex, types.FunctionType, types.BuiltinFunctionType)):
            return (self._const(value, "k"),)
        raise Refused(f"an argument of type {type(value).__name__} cannot be written into the trace")

    def _render_key(self, key) -> Code:
        """A subscript's key in subscript syntax (`v3[s1:s1 + 1, :]`; no slice objects built by calls)."""
        if type(key) is slice and all(type(b) in KEY_BOUNDS for b in (key.start, key.stop, key.step)):
            bounds = [() if b is None else self._render(b) for b in (key.start, key.stop, key.step)]
            return joined(bounds if key.step is not None else bounds[:2], ":")
        if type(key) is tuple and key:
            return joined([self._render_key(k) for k in key]) + (("," if len(key) == 1 else ""),)
        return self._render(key)

    def _literal(self, value, code: Code) -> Code:
        """An immutable argument with no tensor in it (an index tuple, a slice) is built once, not per call."""
        if has_names(code):
            return code
        key = text(code)
        name = self._literals.get(key)
        if name is None:
            name = self._literals[key] = self._const(value, "k")
        return (Lit(name),)

    def source(self, results: list[str], fn_name: str = "replay") -> str:
        """The trace as one function of the entry tensors, returning the tensors named in `results`."""
        return passes.generate(self, results, fn_name)

    def name_of(self, t: torch.Tensor) -> str | None:
        return self.names.get(id(t))

