"""Host programs: a function's code outside its InCore regions, with each region replaced by a task submission.

    with pl.at(level=pl.Level.CORE_GROUP, name_hint="n") as tid:      tid = __rt.submit(__K[i], (x, r, y),
        <body>                                                ->                       "n", deps, None)
                                                                    (a, b) = __rt.results(tid)   # if any

Loops, ifs, `pl.read`, `create_tensor`, views and scalar code stay as they are and run on the host
(through the HostExecutor); only the submissions are new. Positions are the user's, so errors in
host code point at the user's lines.
"""
from __future__ import annotations

import ast

from pypto_rt.frontend.ir import FunctionIR, InCoreRegion
from pypto_rt.incore_compiler import pycode
from pypto_rt.incore_compiler.coalesce import EXTENT


def generate_host(ir: FunctionIR) -> ast.FunctionDef:
    """The host function of `ir` (same name and parameters; annotations dropped)."""
    memo: dict = {}
    tree = pycode.clone(ir.tree, memo)
    replacements = {id(memo[id(r.coalesce.loop if r.coalesce else r.stmt)]): r for r in ir.regions}
    _Replacer(replacements).visit(tree)
    args = tree.args
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    tree.returns = None
    prologue = [ast.Assign([pycode.name("__rt", store=True)], pycode.call("__host"))]
    prologue += [ast.Assign([pycode.name(n, store=True)], pycode.name("__UNBOUND"))
                 for n in ir.unbound_guard if n not in ir.params]
    tree.body = [pycode.located(s, tree) for s in prologue] + tree.body
    return tree


class _Replacer(ast.NodeTransformer):
    def __init__(self, replacements: dict[int, InCoreRegion]):
        self.replacements = replacements

    def generic_visit(self, node):
        for field, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                new = []
                for stmt in value:
                    region = self.replacements.get(id(stmt))
                    if region is None:
                        new.append(self.visit(stmt))
                    else:
                        new.extend(_coalesced(region) if region.coalesce else _submission(region))
                setattr(node, field, new)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)
        return node


def _coalesced(region: InCoreRegion) -> list[ast.stmt]:
    """`for v, __extent in __rt.chunks(start, stop, step, ...): <submit with v, __extent>` (see coalesce.py)."""
    c = region.coalesce
    inputs = [p for p in region.live_ins if p != c.dropped] + ([c.var] if c.new_offset else [])
    others = ast.Tuple([pycode.name(p) for p in inputs if p != c.var], ast.Load())
    chunks = ast.Call(ast.Attribute(pycode.name("__rt"), "chunks", ast.Load()),
                      [pycode.clone(b) for b in c.bounds] + [ast.Constant(c.independent), _kernel(region), others], [])
    target = ast.Tuple([pycode.name(c.var, store=True), pycode.name(EXTENT, store=True)], ast.Store())
    loop = ast.For(target, chunks, _submission(region, inputs + [EXTENT], spmd_blocks=False), [])
    return [pycode.located(loop, c.loop)]


def _kernel(region: InCoreRegion) -> ast.expr:
    return ast.Subscript(pycode.name("__K"), ast.Constant(region.index), ast.Load())


def _submission(region: InCoreRegion, inputs=None, spmd_blocks=True) -> list[ast.stmt]:
    call = pycode.clone(region.call)
    keywords = {k.arg: k.value for k in call.keywords}
    none = ast.Constant(None)
    core_num = None
    if region.kind == "spmd" and spmd_blocks:
        core_num = call.args[0] if call.args else keywords.get("core_num")
    inputs = ast.Tuple([pycode.name(p) for p in (region.live_ins if inputs is None else inputs)], ast.Load())
    submit = ast.Call(
        ast.Attribute(pycode.name("__rt"), "submit", ast.Load()),
        [_kernel(region), inputs,
         keywords.get("name_hint", none), keywords.get("deps", none), core_num or none,
         keywords.get("no_dep_args", none)], [])
    target = region.tid_target if region.tid_target is not None else pycode.name("__task", store=True)
    stmts: list[ast.stmt] = [ast.Assign([pycode.clone(target)], submit)]
    if region.results:
        task = pycode.clone(target)
        for node in ast.walk(task):
            if isinstance(node, ast.Name):
                node.ctx = ast.Load()
        outs = ast.Tuple([pycode.name(n, store=True) for n in region.results], ast.Store())
        stmts.append(ast.Assign([outs], ast.Call(ast.Attribute(pycode.name("__rt"), "results", ast.Load()),
                                                 [task], [])))
    return [pycode.located(s, region.stmt) for s in stmts]
