"""Runs of communication lines called as one: the Python parts of a compiled tier (replay.tier_segments) between
its segments, guarded once per call instead of once per line.

Those parts are recorded `pld` effects (`comm<N>(...)`, replay.comm_block) and the numbers they take, read from data
(`s3 = a8[0, 66].item()`). Each effect checks its operands on every call (the very tensor objects at the same
addresses, the job's windows, its kept plan: 4-7 us a line, 64 lines a call at 8-rank MoE decode). `fused` turns
each run of at least two such lines into one call of a `CommRun`. Its first calls run the lines as recorded; once
two calls in a row took the same tensor objects, it generates a *fast* function for them: one guard at its top (the
tensors the fast lines take are the very objects, at the same addresses, they were when it was planned; no window
allocated or freed since, `process.epoch()`; every window the lines touch still open), then each line as what its
effect's plan comes to (ops.distributed `_Effect.repeat`):
- a store of contiguous bytes: one memmove by address; a put of contiguous rows: one memmove of the row count the
  line reads (none for rows a peer-block staging already holds), or, past the room its plan has, the line as recorded;
- a set notify: the window's publish; a wait: one read of its cell, and where the value is not there yet the line as
  recorded (its wait, deadline and multi-rank report);
- a read of an integer from a tensor: one load through a memoryview of its bytes.
A line with no such plan (an atomic add, another communicator, an operand made anew each call, an argument other
than the row count or value computed per call) runs as recorded, in its place. A guard that fails runs the lines as
recorded and plans anew (at most `MAX_PLANS` times; then the run stays as recorded).
"""
from __future__ import annotations

import ast
import ctypes
import weakref

import torch

from pypto_rt.collective import addresses, process
from pypto_rt.ops.distributed import copy_rows
from pypto_rt.replay.passes import compile_trace
from pypto_rt.replay.tier_source import _function, _names

MAX_PLANS = 4   # plans a run makes (after its second call, and after a guard failed); then it stays as recorded
_FORMATS = {torch.int32: "i", torch.int64: "q", torch.int16: "h", torch.int8: "b", torch.uint8: "B"}
_MISS = object()   # the fast function's answer when its guard fails
# an effect's arguments (ops.distributed: the order replay.comm_block records): (tensor arguments, the argument
# computed per call and where in it, the rest: literals that the effect's kept plan was made for)
_TENSORS = {"publish": (0,), "cell": (0,), "memmove": (0, 4), "rows": (0, 2)}
_NUMBER = {"publish": 4, "cell": 4, "memmove": None, "rows": 5}
_FREE = {"cell": (3,)}   # arguments neither checked nor used by the fast line (a wait's region label)


def fused(statements: list, constants: dict, prefix: str) -> tuple[list, dict]:
    """`statements` (a Python part of a tiered replay) with each run of at least two communication lines and reads
    replaced by the call of a CommRun, and those CommRuns by name (`prefix` + a number) to add to the replay's
    globals."""
    out, runs, run = [], {}, []

    def close():
        if len(run) >= 2:
            name = f"{prefix}{len(runs)}"
            runs[name] = fused_run = CommRun(name, list(run), constants)
            out.extend(ast.parse(fused_run.call_code()).body)
        else:
            out.extend(run)
        run.clear()
    for stmt in statements:
        if _kind(stmt, constants) is not None:
            run.append(stmt)
            continue
        close()
        out.append(stmt)
    close()
    return out, runs


def _kind(stmt, constants: dict) -> str | None:
    """"comm" (an effect's line with no keyword arguments), "read" (`name = tensor[ints].item()`) or None."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name):
        effect = constants.get(stmt.value.func.id)
        return "comm" if hasattr(effect, "repeat") and not stmt.value.keywords else None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return "read" if _read(stmt.value) is not None else None
    return None


def _read(value) -> tuple[str, list[int]] | None:
    """(tensor name, indices) of `tensor[i, j, ...].item()` with integer literals, else None."""
    if not (isinstance(value, ast.Call) and not value.args and not value.keywords
            and isinstance(value.func, ast.Attribute) and value.func.attr == "item"
            and isinstance(value.func.value, ast.Subscript) and isinstance(value.func.value.value, ast.Name)):
        return None
    index = value.func.value.slice
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    if not all(isinstance(i, ast.Constant) and type(i.value) is int and i.value >= 0 for i in items):
        return None
    return value.func.value.value.id, [i.value for i in items]


class CommRun:
    """One run of communication lines and reads: `outputs = run(*params)` (see the module text)."""

    def __init__(self, name: str, statements: list, constants: dict):
        self.name, self.statements, self.constants = name, statements, constants
        made: list[str] = []
        params: list[str] = []
        for stmt in statements:
            params += [n for n in _names(stmt, ast.Load) if n not in made and n not in params and n not in constants]
            made += [n for n in _names(stmt, ast.Store) if n not in made]
        self.params, self.outputs = params, made
        self.recorded = compile_trace(self._source(name, statements), constants, "<pypto-rt communication run>")
        self.fast = None
        self.plans = 0
        self._seen: list | None = None   # (weak reference, address) of each tensor argument of the latest call

    def call_code(self) -> str:
        call = f"{self.name}({', '.join(self.params)})"
        return f"{''.join(o + ', ' for o in self.outputs)}= {call}" if self.outputs else call

    def _source(self, name: str, statements: list) -> str:
        back = ast.parse(f"return ({''.join(o + ', ' for o in self.outputs)})").body
        return _function(name, ", ".join(self.params), statements + back)

    def __call__(self, *args):
        fast = self.fast
        if fast is not None:
            out = fast(*args)
            if out is not _MISS:
                return out
            self.fast = None
        out = self.recorded(*args)
        if self.plans < MAX_PLANS:
            self._plan(args)
        return out

    def _plan(self, args: tuple) -> None:
        """After a call run as recorded: the fast function where this call's tensors are the latest one's."""
        seen, self._seen = self._seen, [(weakref.ref(a), a.data_ptr()) if isinstance(a, torch.Tensor) else None
                                        for a in args]
        if seen is None:
            return
        stable = {n: a for n, a, s in zip(self.params, args, seen)
                  if s is not None and s[0]() is a and s[1] == a.data_ptr()}
        self.plans += 1
        fast = _Fast(stable, self.constants)
        lines = [fast.line(stmt) for stmt in self.statements]
        if not fast.fused:
            return
        source = self._source("fast", ast.parse("\n".join(fast.guard() + lines)).body)
        self.fast = compile_trace(source, {**self.constants, **fast.names}, "<pypto-rt communication run, fast>")


class _Fast:
    """The lines of one fast function and the constants and guard they need."""

    def __init__(self, stable: dict, constants: dict):
        self.stable, self.constants = stable, constants
        self.names: dict = {"_MISS": _MISS, "_mm": addresses.copy, "_copy_rows": copy_rows, "_epoch": process.epoch,
                            "_int": int}
        self.tensors: dict[str, str] = {}    # guarded tensor argument -> its weak reference's name
        self.windows: dict[int, tuple] = {}  # id(window buffer) -> (its weak reference's name, its window's name)
        self.cells: dict[tuple, str] = {}    # (window name, rank) -> the name of its cells
        self.views: dict[str, str] = {}      # tensor argument -> the name of a memoryview of its elements
        self.fused = 0

    def _const(self, value, stem: str) -> str:
        name = f"_{stem}{len(self.names)}"
        self.names[name] = value
        return name

    def _guarded(self, name: str) -> None:
        if name not in self.tensors:
            self.tensors[name] = self._const(weakref.ref(self.stable[name]), "r")

    def guard(self) -> list[str]:
        checks = [f"{ref}() is not {n} or {n}.data_ptr() != {self.stable[n].data_ptr()}"
                  for n, ref in self.tensors.items()]
        lines = [f"if {' or '.join(checks + [f'_epoch() != {process.epoch()}'])}:", "    return _MISS"]
        for ref, window in self.windows.values():
            lines += [f"{window} = {ref}()", f"if {window} is None or {window}.window.closed:", "    return _MISS",
                      f"{window} = {window}.window"]
        lines += [f"{cells} = {window}.cells({rank})" for (window, rank), cells in self.cells.items()]
        return lines

    def line(self, stmt) -> str:
        recorded = ast.unparse(stmt)
        if isinstance(stmt, ast.Assign):
            return self._read(stmt, recorded)
        call = stmt.value
        effect = self.constants[call.func.id]
        tensors = [a.id for a in call.args if isinstance(a, ast.Name) and a.id in self.stable]
        found = effect.repeat(tuple(self.stable[n] for n in tensors)) if tensors else None
        if found is None:
            return recorded
        buf, plan = found
        kind = plan[0]
        if len(call.args) <= max(_TENSORS[kind]) or [ast.unparse(call.args[i]) for i in _TENSORS[kind]] != tensors:
            return recorded
        number = _NUMBER[kind]
        skip = set(_TENSORS[kind]) | set(_FREE.get(kind, ())) | ({number} if number is not None else set())
        if not all(_literal(a) for i, a in enumerate(call.args) if i not in skip):
            return recorded
        if kind == "rows":   # the shape: [rows, literals...] or None
            shape = call.args[number]
            if _literal(shape) and ast.literal_eval(shape) is None:
                rows = None
            elif isinstance(shape, ast.List) and shape.elts and all(_literal(e) for e in shape.elts[1:]):
                rows = ast.unparse(shape.elts[0])
            else:
                return recorded
        for n in tensors:
            self._guarded(n)
        self.fused += 1
        window = self._window(buf)
        if kind == "publish":
            return f"{window}.publish({plan[1]}, {plan[2]}, _int({ast.unparse(call.args[number])}))"
        if kind == "cell":
            cells = self.cells.setdefault((window, plan[1]), f"_c{len(self.cells)}")
            compare = ">=" if plan[3] == "ge" else "=="
            return f"if not {cells}[{plan[2]}] {compare} _int({ast.unparse(call.args[number])}):\n    {recorded}"
        if kind == "memmove":
            return f"_mm({plan[1]}, {self.stable[tensors[1]].data_ptr()}, {plan[2]})"
        return self._rows(plan, self.stable[tensors[1]].data_ptr(), rows, recorded)

    def _rows(self, plan: tuple, source: int, rows: str | None, recorded: str) -> str:
        """A put as ops.distributed.copy_rows runs its byte run from `source`, `rows` (code; None: the default) up
        to the room; past it the line as recorded."""
        run, room, default = plan[1], plan[2], plan[3]
        copy = f"_copy_rows({self._const(run, 'p')}, {source}, "
        if rows is None:
            return copy + f"{default})"
        return f"_n = _int({rows})\nif 0 <= _n <= {room}:\n    {copy}_n)\nelse:\n    {recorded}"

    def _window(self, buf) -> str:
        if id(buf) not in self.windows:
            n = len(self.windows)
            self.windows[id(buf)] = (self._const(weakref.ref(buf), "w"), f"_x{n}")
        return self.windows[id(buf)][1]

    def _read(self, stmt, recorded: str) -> str:
        name, indices = _read(stmt.value)
        tensor = self.stable.get(name)
        fmt = None if tensor is None else _FORMATS.get(tensor.dtype)
        if fmt is None or not tensor.is_cpu or len(indices) != tensor.dim() or tensor.numel() == 0 or \
                any(i >= n for i, n in zip(indices, tensor.shape)):
            return recorded
        view = self.views.get(name)
        if view is None:
            span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
            raw = (ctypes.c_char * (span * tensor.element_size())).from_address(tensor.data_ptr())
            view = self.views[name] = self._const(memoryview(raw).cast("B").cast(fmt), "v")
        self._guarded(name)
        self.fused += 1
        at = sum(i * s for i, s in zip(indices, tensor.stride()))
        return f"{stmt.targets[0].id} = {view}[{at}]"


def _literal(node) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True
