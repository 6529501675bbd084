"""The front end's IR: a function's Python AST (positions = the user's source) plus its outlined InCore regions.

Host code stays Python statements; every InCore region (a `pl.at(CORE_GROUP)` body, a `pl.spmd` body)
becomes an `InCoreRegion` with explicit inputs and results, which the InCore compiler turns into a kernel and
orchestration turns into a task submission.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from pypto_rt.errors import Span


@dataclass
class InCoreRegion:
    """One InCore region of a function (a `pl.at` or `pl.spmd` body), outlined; the engine's byte ranges are
    aicpu.MemoryRegion."""
    index: int
    kind: str                      # "at" | "spmd"
    stmt: ast.With | ast.For       # the statement the region replaces
    call: ast.Call                 # its pl.at(...) / pl.spmd(...) call (name_hint=, deps=, core count)
    body: list[ast.stmt]
    span: Span
    block_var: str | None = None   # `for b in pl.spmd(n)`: the block index variable
    tid_target: ast.expr | None = None   # `... as tid`
    in_host_loop: bool = False     # its results may flow into its own next instance
    coalesce: object = None        # incore_compiler.coalesce.Coalescing when its loop's iterations merge
    live_ins: list[str] = field(default_factory=list)    # parameters, in order
    results: list[str] = field(default_factory=list)     # names the host reads afterwards (it waits for them)
    aliased: list[str] = field(default_factory=list)     # rebound names that stay the same tensor as a live-in


@dataclass
class FunctionIR:
    """A kernel function as the compiler sees it."""
    name: str
    file: str
    tree: ast.FunctionDef
    context: str                   # "host" (orchestration with regions) | "incore" (kernel code throughout)
    params: list[str]
    regions: list[InCoreRegion]
    local_names: set[str]
    unbound_guard: list[str] = field(default_factory=list)   # locals pre-bound to a sentinel in host code
    notes: list = field(default_factory=list)      # frontend.notes.StyleNote: style warnings, not errors
