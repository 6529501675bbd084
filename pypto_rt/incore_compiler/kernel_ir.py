"""What the InCore compiler hands a backend: one outlined kernel, and what comes back."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from pypto_rt.errors import Span
from pypto_rt.frontend.resolve import Env
from pypto_rt.incore_compiler.accesses import ParamAccess


@dataclass
class KernelIR:
    """An InCore kernel: `params` in, `results` out; `block_var` (spmd) is bound to the block index."""
    name: str                       # a Python identifier, unique within its function
    display: str                    # name_hint or function name, for traces and messages
    file: str
    span: Span
    params: list[str]
    body: list[ast.stmt]
    env: Env
    anchor: ast.AST                 # the statement the kernel was outlined from (positions)
    block_var: str | None = None
    results: list[str] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)    # params that may arrive as the UNBOUND sentinel
    returns_value: bool = False     # an @pl.jit.incore function: the body's `return` is the result
    accesses: list[ParamAccess] = field(default_factory=list)
    signature: ast.arguments | None = None   # the function's own parameters (defaults kept), if not `params`
    coalesce_var: str | None = None          # a coalesced region: the loop variable (an input)
    coalesce_untiled: tuple[str, ...] = ()   # ... and inputs it merges only when their extent along it is 1
    coalesce_dim: int = 0


@dataclass
class GeneratedKernel:
    """A backend's generated code for one kernel: `run(block_idx, *params)` executes one block and returns its
    results (one InCore kernel, not a whole entry call prepared by `fn.compile`)."""
    ir: KernelIR
    run: Callable[..., Any]
    source: str                     # readable generated code (dumped with PYPTO_DUMP_DIR)
    backend: str
    factory: Any = None             # pycode.Factory the run function came from (what the disk cache stores)
    ops: dict = field(default_factory=dict)   # injected `__op_*` name -> op qualname


class Backend(Protocol):
    """A code generator for InCore kernels (torch on the CPU now; triton on GPUs later)."""
    name: str

    def compile(self, kernel: KernelIR, module_globals: dict, direct_ops: bool = True) -> GeneratedKernel: ...


class Unbound:
    """The value of a kernel input the host had not bound yet (the kernel unbinds it on entry)."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "<unbound>"


UNBOUND = Unbound()
