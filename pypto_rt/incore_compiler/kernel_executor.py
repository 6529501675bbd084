"""The executor active on a worker while it runs one block of a compiled kernel.

Compiled kernels call most ops directly; what still reaches an executor from kernel code —
subscripts, block/sub-block intrinsics, carried `init_values` loops, `pl.yield_`, inline kernels —
has the semantics every executor shares (executor_base), with the block index of the running block.
Inline kernels called here run their compiled InCore form.
"""
from __future__ import annotations

from pypto_rt.errors import DSLError, user_span
from pypto_rt.executor_base import ExecutorBase, refuse_unrunnable
from pypto_rt.frontend.python_calls import plain_python_calls
from pypto_rt.incore_compiler.compiler import incore_kernel
from pypto_rt.language.enums import Level
from pypto_rt.language.scopes import Spmd
from pypto_rt.ops import recording


def refuse_replay_of_plain_python(kernel) -> None:
    """A run (or kernel block) being recorded for replay (replay.entry, replay.kernel) that calls a
    kernel function calling the user's plain Python must not be replayed: the replay would skip those calls."""
    if recording.recording():
        calls = kernel.state.python_calls
        if calls is None:
            calls = kernel.state.python_calls = plain_python_calls(kernel.fn)
        if calls:
            recording.refuse(f"{kernel.name} calls plain Python ({calls[0]}), which only the engine runs")


class KernelExecutor(ExecutorBase):
    """Runs kernel code for block `block_idx` of `block_num`."""

    def __init__(self, binding, block_idx: int = 0, block_num: int = 1):
        super().__init__(binding)
        self.block_idx = block_idx
        self.block_num = block_num

    def call_kernel(self, kernel, args, kwargs):
        refuse_replay_of_plain_python(kernel)
        refuse_unrunnable(kernel, kwargs)
        return incore_kernel(kernel, traced=recording.recording()).kernel.run(self.block_idx, *args, **kwargs)

    def iterate(self, loop):
        if isinstance(loop, Spmd):
            raise DSLError("pl.spmd inside InCore code", loop.span, "dispatch pl.spmd from orchestration code")
        return super().iterate(loop)

    def enter_scope(self, scope):
        if scope.kind == "at" and scope.level in (None, Level.CORE_GROUP):
            raise DSLError("a pl.at region inside InCore code", scope.span or user_span(),
                           "InCore regions cannot nest; merge the two bodies")
        return super().enter_scope(scope)
