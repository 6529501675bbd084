"""The reference executor: runs a kernel's Python body eagerly, in program order, on the op library.

It is the semantic oracle every other executor is checked against (like Triton's interpreter), and
depends on no part of the compiled runtime: what it shares with the product executors is the small
`executor_base.ExecutorBase` (op dispatch, loops, scopes, intrinsics), not a class of theirs.
Loops iterate in order, `pl.parallel` iterations and spmd blocks run one after another, and
scheduling hints (`deps=`, scopes, task_dummy, prefetch) are genuine no-ops: sequential program
order is a legal schedule of every task graph. Before a kernel function first runs in a context
(host or InCore code) it passes the front end's placement checks, as it does when compiled: the
same errors, and the same style warnings once per function. A host-form program's body runs here too,
its `f(..., device=r)` calls handed to the `dispatch` it was given (the host form's job).
"""
from __future__ import annotations

import types
from typing import Callable

from pypto_rt.errors import user_span
from pypto_rt.executor_base import ExecutorBase, is_incore, refuse_unrunnable, warn_directions_on_inline
from pypto_rt.frontend.analyze import placement_notes
from pypto_rt.frontend.notes import warn_once
from pypto_rt.language.decorators import ProgramNamespace
from pypto_rt.language.scopes import Spmd
from pypto_rt.reference.rewrite import rewrite_spmd_with


class ReferenceExecutor(ExecutorBase):
    """Eager, single-threaded execution of one entry call."""

    def __init__(self, binding, dispatch: Callable | None = None):
        super().__init__(binding)
        self.dispatch = dispatch   # (rank, kernel, args, kwargs, span) for `device=r` calls: the host form's

    # -- entry -----------------------------------------------------------------------------------
    def run_entry(self, kernel):
        return self.call_kernel(kernel, tuple(self.binding.values), {})

    def call_kernel(self, kernel, args, kwargs):
        if "device" in kwargs and self.dispatch is not None:
            kwargs = dict(kwargs)
            rank = int(kwargs.pop("device"))
            self.dispatch(rank, kernel, args, kwargs, user_span())
            return None
        refuse_unrunnable(kernel, kwargs)
        incore = is_incore(kernel)
        context = "incore" if incore or self.incore_depth else "host"
        state = kernel.state
        if context not in state.reference_checked:   # placement depends on where the function runs
            warn_once(kernel, placement_notes(kernel, context))
            state.reference_checked.add(context)
        fn = state.reference
        if fn is None:
            if kernel.kind == "inline":
                warn_directions_on_inline(kernel)
            fn = with_program_self(rewrite_spmd_with(kernel.fn) or kernel.fn)
            state.reference = fn
        self.incore_depth += incore
        try:
            return fn(*args, **kwargs)
        finally:
            self.incore_depth -= incore

    # -- loops -----------------------------------------------------------------------------------
    def iterate(self, loop):
        if isinstance(loop, Spmd):
            return self._spmd_blocks(loop)
        return super().iterate(loop)

    def _spmd_blocks(self, spmd: Spmd):
        n = int(spmd.core_num)
        saved = self.block_idx, self.block_num
        self.incore_depth += 1
        try:
            for b in range(n):
                self.block_idx, self.block_num = b, n
                yield b
        finally:
            self.block_idx, self.block_num = saved
            self.incore_depth -= 1


def with_program_self(fn):
    """`fn`, seeing `self` as its program's namespace when its body names a global `self` (kernel-library code
    writes `self.helper` for a function of its module: see ProgramNamespace)."""
    if "self" not in fn.__code__.co_names or "self" in fn.__globals__:
        return fn
    module_globals = dict(fn.__globals__, self=ProgramNamespace(fn.__globals__))
    bound = types.FunctionType(fn.__code__, module_globals, fn.__name__, fn.__defaults__, fn.__closure__)
    bound.__kwdefaults__, bound.__wrapped__ = fn.__kwdefaults__, fn
    return bound
