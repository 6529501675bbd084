"""The torch backend: an InCore kernel becomes a Python function of direct calls into the op library.

Generated code for a region reads like the region itself, with three changes:
- every `pl.<op>(...)` whose op is statically known calls the op's implementation directly
  (`__op_add(...)`), skipping the per-op executor dispatch the reference executor pays;
- `pl.range/parallel/pipeline/unroll` loops without carried state become plain `range` loops;
- inputs become parameters, the spmd block variable is bound from the block index, and results
  are returned as a tuple.
Everything else (subscripts, intrinsics such as `pl.get_block_idx()`, inline kernel calls, carried
`init_values` loops) runs through the worker's KernelExecutor, with the same semantics.
"""
from __future__ import annotations

import ast
import builtins

from pypto_rt.frontend.resolve import Env, callee, is_loop, op_name
from pypto_rt.incore_compiler import pycode
from pypto_rt.incore_compiler.chunks import wide_chunks
from pypto_rt.incore_compiler.kernel_ir import UNBOUND, GeneratedKernel, KernelIR
from pypto_rt.language import scopes
from pypto_rt.language.surface import EXECUTOR_INTRINSICS
from pypto_rt.ops import OPS
from pypto_rt.ops.value import TensorValue
from pypto_rt.ops.views import subscript_read, subscript_write
from pypto_rt.replay import traced_code
from pypto_rt.replay.scalars import host_key


def subscript(x, key):
    """`x[key]`: a tensor window through the op library, anything else as Python indexes it."""
    return subscript_read(x, key) if type(x) is TensorValue else x[key]


def subscript_set(x, key, value) -> None:
    """`x[key] = value`: a tensor write through the op library, anything else as Python assigns it."""
    if type(x) is TensorValue:
        subscript_write(x, key, value)
    else:
        x[key] = value


def traced_subscript(x, key):
    """`subscript` in a recorded run's kernels: a tensor window as it is (offsets read from data stay code), any
    other container's key pinned (Python reads a TracedInt index without asking)."""
    return subscript(x, host_key(x, key))


def traced_subscript_set(x, key, value) -> None:
    """`subscript_set` in a recorded run's kernels, likewise."""
    subscript_set(x, host_key(x, key), value)


def loop_range(*bounds):
    """`range` that accepts integral scalars of any kind (numpy/torch ints, bools); a TracedInt bound goes through
    int(), which pins it (recorded runs rely on this)."""
    for b in bounds:
        if type(b) is not int:
            return builtins.range(*(int(b) for b in bounds))
    return builtins.range(*bounds)


def disjoint(reads: tuple, writes: tuple) -> bool:
    """No tensor in `reads` shares memory with one in `writes` other than as the very same view (a merged tile
    loop's condition, see coalesce.merge_tile_loops)."""
    for w in writes:
        if type(w) is not TensorValue:
            return False
        wd = w.data
        for r in reads:
            if type(r) is TensorValue and r.data.untyped_storage().data_ptr() == wd.untyped_storage().data_ptr() \
                    and (r.data.storage_offset(), r.data.stride(), r.data.shape) != (
                        wd.storage_offset(), wd.stride(), wd.shape):
                return False
    return True


# names every generated kernel may use, besides its ops (`__op_*`) and the closure of its function
RUNTIME_NAMES = {"__UNBOUND": UNBOUND, "__range": loop_range, "__subscript": subscript,
                 "__subscript_set": subscript_set, "__slice": builtins.slice, "__disjoint": disjoint,
                 "__wide_chunks": wide_chunks}


# a recorded run's kernels (traced=True): the routed arithmetic's helpers and pinning subscripts
_TRACED_NAMES = {**traced_code.RUNTIME_NAMES, "__subscript": traced_subscript, "__subscript_set": traced_subscript_set}


class TorchBackend:
    name = "torch"

    def compile(self, kernel: KernelIR, module_globals: dict, direct_ops: bool = True,
                traced: bool = False) -> GeneratedKernel:
        """`direct_ops=False` keeps every `pl` call going through the executor (PYPTO_CHECK=reference);
        `traced`: the variant a run recorded for replay executes (see traced_code)."""
        rewriter = _OpRewriter(kernel.env, direct_ops)
        body = [rewriter.visit(stmt) for stmt in pycode.clone(kernel.body)]
        if traced:
            body = [traced_code.route(stmt, module_globals, set(module_globals) | set(kernel.env.closure))
                    for stmt in body]
        prologue = []
        for p in kernel.guards:
            prologue.append(ast.If(ast.Compare(pycode.name(p), [ast.Is()], [pycode.name("__UNBOUND")]),
                                   [ast.Delete([ast.Name(p, ast.Del())])], []))
        if kernel.block_var:
            prologue.append(ast.Assign([pycode.name(kernel.block_var, store=True)], pycode.name("__block")))
        epilogue = []
        if not kernel.returns_value:
            results = ast.Tuple([pycode.name(r) for r in kernel.results], ast.Load())
            epilogue.append(ast.Return(results if kernel.results else ast.Constant(None)))
        fdef = ast.FunctionDef(name=kernel.name, args=kernel.signature or pycode.arguments(["__block"] + kernel.params),
                               body=[pycode.located(s, kernel.anchor) for s in prologue] + body
                               + [pycode.located(s, kernel.anchor) for s in epilogue],
                               decorator_list=[], returns=None, **pycode._TYPE_PARAMS)
        ast.copy_location(fdef, kernel.anchor)
        injected = {**RUNTIME_NAMES, **rewriter.injected, **(_TRACED_NAMES if traced else {})}
        injected.update(kernel.env.closure)
        factory, (run,) = pycode.build_functions([fdef], injected, kernel.file, module_globals, kernel.anchor)
        header = _header(kernel, rewriter)
        return GeneratedKernel(kernel, run, pycode.source_of([fdef], header), self.name, factory,
                              dict(rewriter.ops))


class _OpRewriter(ast.NodeTransformer):
    """Statically known `pl` ops -> direct op-library calls; plain `pl` loops -> `range`."""

    def __init__(self, env: Env, direct_ops: bool):
        self.env = env
        self.direct_ops = direct_ops
        self.injected: dict[str, object] = {}
        self.ops: dict[str, str] = {}

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        qual = op_name(callee(self.env, node))
        if not self.direct_ops or qual is None or qual in EXECUTOR_INTRINSICS or qual not in OPS:
            return node
        local = "__op_" + qual.replace(".", "_")
        self.injected[local] = OPS[qual]
        self.ops[local] = qual
        return ast.copy_location(ast.Call(pycode.name(local), node.args, node.keywords), node)

    def visit_Subscript(self, node: ast.Subscript):
        self.generic_visit(node)
        if not self.direct_ops or not isinstance(node.ctx, ast.Load):
            return node
        return ast.copy_location(ast.Call(pycode.name("__subscript"), [node.value, _key(node.slice)], []), node)

    def visit_Assign(self, node: ast.Assign):
        self.generic_visit(node)
        target = node.targets[0]
        if not self.direct_ops or len(node.targets) != 1 or not isinstance(target, ast.Subscript):
            return node
        call = ast.Call(pycode.name("__subscript_set"), [target.value, _key(target.slice), node.value], [])
        return ast.copy_location(ast.Expr(ast.copy_location(call, node)), node)

    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        it = node.iter
        loop = callee(self.env, it) if isinstance(it, ast.Call) else None
        keywords = {k.arg for k in it.keywords} if isinstance(it, ast.Call) else set()
        if (is_loop(loop) and 1 <= len(it.args) <= 3 and "init_values" not in keywords
                and (loop is not scopes.pipeline or "stage" in keywords)):   # else pl.pipeline says what is missing
            node.iter = ast.copy_location(ast.Call(pycode.name("__range"), it.args, []), it)
        return node


def _key(index: ast.expr) -> ast.expr:
    """A subscript's index as an expression: `a:b` becomes `__slice(a, b, None)` (valid outside brackets)."""
    if isinstance(index, ast.Slice):
        parts = [index.lower, index.upper, index.step]
        return ast.copy_location(ast.Call(pycode.name("__slice"), [p or ast.Constant(None) for p in parts], []),
                                 index)
    if isinstance(index, ast.Tuple):
        return ast.copy_location(ast.Tuple([_key(e) for e in index.elts], ast.Load()), index)
    return index


def _header(kernel: KernelIR, rewriter: _OpRewriter) -> str:
    lines = [f"# pypto-rt torch kernel '{kernel.display}' outlined from {kernel.span}",
             f"# inputs: {', '.join(kernel.params) or '-'}; results: {', '.join(kernel.results) or '-'}"
             + (f"; block index -> {kernel.block_var}" if kernel.block_var else "")]
    lines.append("# accesses (mode input[offset:+size], * = to the end, [:] = whole; scalars are listed too):")
    for a in kernel.accesses:
        box = "[:]" if a.offsets is None else "[" + ", ".join(
            ":" if o is None else
            f"{ast.unparse(o)}:+{ast.unparse(s) if s is not None else '*'}"
            for o, s in zip(a.offsets, a.sizes)) + "]"
        lines.append(f"#   {a.mode:>2} {a.param}{box}")
    lines.append(f"# ops called directly: {', '.join(sorted(n[5:] for n in rewriter.injected)) or '-'}")
    return "\n".join(lines)
