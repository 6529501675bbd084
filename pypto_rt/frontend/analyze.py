"""From a kernel function to its IR: find the InCore regions, check placement, outline inputs and results.

Only what the real compiler rejects is an error here, at the user's file:line:col: `pl.spmd` or a
nested `pl.at` inside InCore code, control flow (`return`, `break`, `continue`) that would leave an
InCore region, and `break` / `continue` directly in a `pl.parallel` or `pl.unroll` loop. What it accepts
but the style guide places elsewhere is a style note (frontend.notes) and runs as the real compiler
runs it: `pl.parallel` inside InCore code is a sequential loop there, `pl.pipeline` outside it a
sequential loop. Where each rule comes from: notes/semantics_decisions.md.
"""
from __future__ import annotations

import ast

from pypto_rt.errors import DSLError, UnknownOpError
from pypto_rt.frontend import names
from pypto_rt.frontend.ir import FunctionIR, InCoreRegion
from pypto_rt.frontend.notes import StyleNote
from pypto_rt.frontend.resolve import LOOPS, UNRESOLVED, Env, callee
from pypto_rt.frontend.source import parse_function, span_of
from pypto_rt.language import scopes
from pypto_rt.language.enums import Level
from pypto_rt.language.ops import Namespace

_PL_MODULES = {"pypto.language", "pypto_rt.language", "pypto.language.distributed",
               "pypto_rt.language.distributed"}


def analyze(kernel, context: str = "host") -> FunctionIR:
    """The IR of `kernel` (a KernelFunction) compiled for `context`: "host" or "incore"."""
    ir = _find_regions(kernel, context)
    if context == "host":
        _outline(ir)
    return ir


def placement_notes(kernel, context: str = "host") -> list[StyleNote]:
    """The placement checks alone, for executors that run the source as written: raises a placement error,
    returns the style notes."""
    return _find_regions(kernel, context).notes


def _find_regions(kernel, context: str) -> FunctionIR:
    fn = kernel.fn
    parsed = parse_function(fn)
    env = Env(fn)
    tree = parsed.tree
    args = tree.args
    params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    ir = FunctionIR(kernel.name, parsed.file, tree, context, params, [],
                    set(params) | names.stored_names(tree.body))
    finder = _RegionFinder(env, parsed.file, ir)
    finder.block(tree.body, incore=(context == "incore"), host_loop=False)
    return ir


class _RegionFinder:
    """Walks statements once: records regions, enforces placement, reports unknown `pl` names."""

    def __init__(self, env: Env, file: str, ir: FunctionIR):
        self.env, self.file, self.ir = env, file, ir

    def block(self, stmts, *, incore: bool, host_loop: bool, loop_in_region: bool = False,
              in_region: bool = False):
        """`in_region`: inside an outlined region's body (an InCore function's own body may `return`)."""
        for stmt in stmts:
            self.stmt(stmt, incore=incore, host_loop=host_loop, loop_in_region=loop_in_region, in_region=in_region)

    def stmt(self, stmt, *, incore, host_loop, loop_in_region, in_region):
        region = None if incore else self._region_of(stmt)
        if region is not None:
            self._check_exprs(self._header_exprs(stmt), incore=False)
            region.index = len(self.ir.regions)
            region.in_host_loop = host_loop
            self.ir.regions.append(region)
            self.block(region.body, incore=True, host_loop=host_loop, in_region=True)
            return
        if in_region and isinstance(stmt, ast.Return):
            raise DSLError("`return` inside an InCore region (a pl.at or pl.spmd body)", span_of(self.file, stmt),
                           "assign the value to a name and return it after the region")
        if in_region and not loop_in_region and isinstance(stmt, (ast.Break, ast.Continue)):
            raise DSLError(f"`{type(stmt).__name__.lower()}` inside an InCore region leaves the region",
                           span_of(self.file, stmt), "move the loop control outside the pl.at body")
        if isinstance(stmt, ast.For):
            self._check_loop_control(stmt)
        if incore and isinstance(stmt, ast.With) and self._is_incore_scope(stmt):
            raise DSLError("a pl.at(level=CORE_GROUP) region nested inside another InCore region",
                           span_of(self.file, stmt), "an InCore region cannot contain another; merge them")
        body_fields = [f for f in ("body", "orelse", "finalbody") if isinstance(getattr(stmt, f, None), list)]
        exprs = [child for name, child in ast.iter_fields(stmt) if name not in body_fields]
        self._check_exprs(exprs, incore=incore)
        is_loop = isinstance(stmt, (ast.For, ast.While, ast.AsyncFor))
        for f in body_fields:
            self.block(getattr(stmt, f), incore=incore, host_loop=host_loop or (is_loop and not incore),
                       loop_in_region=loop_in_region or (is_loop and incore), in_region=in_region)
        for handler in getattr(stmt, "handlers", []):
            self.block(handler.body, incore=incore, host_loop=host_loop, loop_in_region=loop_in_region,
                       in_region=in_region)

    @staticmethod
    def _header_exprs(stmt):
        if isinstance(stmt, ast.For):
            return [stmt.iter]
        return [item.context_expr for item in stmt.items]

    # -- what a statement is ---------------------------------------------------------------------
    def _region_of(self, stmt) -> InCoreRegion | None:
        span = span_of(self.file, stmt)
        if isinstance(stmt, ast.For) and callee(self.env, stmt.iter) is scopes.spmd:
            if not isinstance(stmt.target, ast.Name):
                raise DSLError("the block index of `for ... in pl.spmd(n)` must be a plain name", span)
            if stmt.orelse:
                raise DSLError("`for ... in pl.spmd(n)` cannot have an `else:` block", span)
            return InCoreRegion(0, "spmd", stmt, stmt.iter, stmt.body, span, block_var=stmt.target.id)
        if isinstance(stmt, ast.With) and len(stmt.items) == 1:
            item = stmt.items[0]
            target = item.optional_vars
            if callee(self.env, item.context_expr) is scopes.spmd:
                return InCoreRegion(0, "spmd", stmt, item.context_expr, stmt.body, span, tid_target=target)
            if self._is_incore_scope(stmt):
                return InCoreRegion(0, "at", stmt, item.context_expr, stmt.body, span, tid_target=target)
        return None

    def _is_incore_scope(self, stmt) -> bool:
        if not isinstance(stmt, ast.With) or len(stmt.items) != 1:
            return False
        call = stmt.items[0].context_expr
        if callee(self.env, call) is not scopes.at:
            return False
        level = next((kw.value for kw in call.keywords if kw.arg == "level"), call.args[0] if call.args else None)
        if level is None:
            return True
        value = self.env.resolve(level)
        return value is UNRESOLVED or value == Level.CORE_GROUP

    # -- placement of calls ----------------------------------------------------------------------
    def _check_exprs(self, nodes, *, incore: bool):
        for root in nodes:
            if not isinstance(root, ast.AST):
                continue
            for node in ast.walk(root):
                if isinstance(node, ast.Attribute):
                    self._check_known(node)
                elif isinstance(node, ast.Call):
                    self._check_call(node, incore)

    def _check_call(self, node: ast.Call, incore: bool):
        target = callee(self.env, node)
        if incore and target is scopes.spmd:
            raise DSLError("pl.spmd inside an InCore region (a pl.at or pl.spmd body or an InCore function)",
                           span_of(self.file, node), "put the pl.spmd loop outside the region: it dispatches "
                           "InCore blocks; use pl.range for a sequential loop inside")
        if incore and target is scopes.parallel:
            self._note(node, "pl.parallel inside InCore code (a pl.at or pl.spmd body or an InCore function) runs "
                             "as a sequential loop on its core, as the real compiler lowers it; the style guide "
                             "puts pl.parallel in orchestration code: write pl.range here, or put the pl.parallel "
                             "loop around the region")
        if not incore and target is scopes.pipeline:
            self._note(node, "pl.pipeline outside InCore code runs as a sequential loop, as the real compiler "
                             "lowers it; the style guide puts pl.pipeline inside a pl.at body (it software-"
                             "pipelines an InCore loop): write pl.range here, or move the loop into the region")

    def _note(self, node: ast.AST, message: str):
        self.ir.notes.append(StyleNote(message, self.file, node.lineno))

    def _check_loop_control(self, loop: ast.For):
        """`break` / `continue` directly in a pl.parallel or pl.unroll loop: the real parser rejects both."""
        kind = callee(self.env, loop.iter)
        if kind is not scopes.parallel and kind is not scopes.unroll:
            return
        node = next(_own_loop_control(loop.body), None)
        if node is not None:
            word = type(node).__name__.lower()
            raise DSLError(f"`{word}` in a pl.{LOOPS[kind]} loop", span_of(self.file, node),
                           f"`{word}` can only be used in a pl.range loop or a Python while loop")

    def _check_known(self, node: ast.Attribute):
        base = self.env.resolve(node.value)
        is_pl = isinstance(base, Namespace) or getattr(base, "__name__", None) in _PL_MODULES
        if not is_pl or node.attr.startswith("__"):
            return
        try:
            getattr(base, node.attr)
        except AttributeError as e:
            message = e.message if isinstance(e, UnknownOpError) else f"unknown op pl.{node.attr}"
            hint = e.hint if isinstance(e, UnknownOpError) else None
            raise UnknownOpError(message, span_of(self.file, node), hint) from None


def _own_loop_control(stmts):
    """The `break` / `continue` statements of a loop body that act on that loop (not on a loop inside it)."""
    for stmt in stmts:
        if isinstance(stmt, (ast.Break, ast.Continue)):
            yield stmt
        elif not isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
                                   ast.ClassDef)):
            for _, value in ast.iter_fields(stmt):
                if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                    yield from _own_loop_control(value)
            for handler in getattr(stmt, "handlers", []):
                yield from _own_loop_control(handler.body)


def _outline(ir: FunctionIR) -> None:
    """Fill each region's inputs, results and aliased results (see frontend/names.py for the facts used)."""
    region_stmts = {id(r.stmt) for r in ir.regions}
    host_stmts = _host_only(ir.tree.body, region_stmts)
    host_loads = names.loaded_names(host_stmts)
    host_bound = set(ir.params) | names.stored_names(host_stmts)
    exposed = []
    for r in ir.regions:
        start = {r.block_var} if r.block_var else set()
        exposed.append(names.exposed_reads(r.body, start) & ir.local_names)
    written = [names.stored_names(r.body) - ({r.block_var} if r.block_var else set()) for r in ir.regions]
    all_written = set().union(*written) if written else set()
    guard: set[str] = set()
    for r, reads, writes in zip(ir.regions, exposed, written):
        later_reads = host_loads | set().union(*(e for e, other in zip(exposed, ir.regions) if other is not r))
        if r.in_host_loop:
            later_reads |= reads - _rebound_by_host_before(ir.tree, r.stmt)
        r.live_ins = sorted(reads & (host_bound | all_written))
        outs = writes & later_reads & ir.local_names
        r.aliased = sorted(n for n in outs if n in r.live_ins and _always_rebinds_in_place(r.body, n))
        r.results = sorted(outs - set(r.aliased))
        guard |= (set(r.live_ins) | set(r.results)) - set(ir.params)
    ir.unbound_guard = sorted(guard)


def _rebound_by_host_before(tree, region_stmt) -> set[str]:
    """Names the innermost host loop around a region rebinds unconditionally before reaching the region.

    A value a region binds cannot reach the region's next instance through such a name (the
    `acc = pl.create_tensor(...)` before `with pl.at(): acc = pl.matmul(...)` idiom).
    """
    path = _path_to(tree.body, region_stmt)
    loop_at = max((i for i, (stmt, _) in enumerate(path) if isinstance(stmt, (ast.For, ast.While))
                   and stmt is not region_stmt), default=None)
    if loop_at is None:
        return set()
    killed: set[str] = set()
    for stmt, siblings_before in path[loop_at + 1:]:
        for sib in siblings_before:
            if isinstance(sib, (ast.Assign, ast.AnnAssign)):
                killed |= names.stored_names(sib.targets if isinstance(sib, ast.Assign) else sib.target)
    return killed


def enclosing_statement(tree, stmt):
    """The statement whose block directly holds `stmt` (None at the top level)."""
    path = _path_to(tree.body, stmt)
    return path[-2][0] if len(path) >= 2 else None


def _path_to(stmts, target) -> list:
    """[(stmt, statements preceding it in its block)] from the top block down to `target`."""
    for i, stmt in enumerate(stmts):
        if stmt is target:
            return [(stmt, stmts[:i])]
        for _, value in ast.iter_fields(stmt):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                below = _path_to(value, target)
                if below:
                    return [(stmt, stmts[:i])] + below
    return []


def _host_only(stmts, region_ids: set[int]) -> list:
    """Statements of host code with region bodies cut out (region headers stay: their calls run on the host)."""
    out = []
    for stmt in stmts:
        if id(stmt) in region_ids:
            header = stmt.iter if isinstance(stmt, ast.For) else [i.context_expr for i in stmt.items]
            out.extend(header if isinstance(header, list) else [header])
            if isinstance(stmt, ast.With) and stmt.items[0].optional_vars is not None:
                out.append(ast.Assign(targets=[stmt.items[0].optional_vars], value=ast.Constant(None)))
            continue
        clone = []
        for name, value in ast.iter_fields(stmt):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                clone.extend(_host_only(value, region_ids))
            elif isinstance(value, list) and value and isinstance(value[0], ast.ExceptHandler):
                for h in value:
                    clone.extend(_host_only(h.body, region_ids))
        out.append(_shallow(stmt))
        out.extend(clone)
    return out


def _shallow(stmt):
    """`stmt` without its nested statement blocks (its own expressions only)."""
    fields = {}
    for name, value in ast.iter_fields(stmt):
        if isinstance(value, list) and value and isinstance(value[0], (ast.stmt, ast.ExceptHandler)):
            value = []
        fields[name] = value
    return type(stmt)(**fields)


# ops that return the tensor they write into, by the position / keyword of that tensor
_IN_PLACE_RESULT = {"assemble": (0, "target"), "tensor.assemble": (0, "target"), "tile.assemble": (0, "target"),
                    "store": (2, "output_tensor"), "tile.store": (2, "output_tensor"),
                    "fillpad_inplace": (0, "x"), "tile.fillpad_inplace": (0, "x")}


def _always_rebinds_in_place(body, name: str) -> bool:
    """True when every binding of `name` in `body` is `name = pl.<op returning its target>(..., name, ...)`."""
    found = False
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.With, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [
                getattr(node, "target", None) or getattr(node, "optional_vars", None)]
            if isinstance(node, ast.With):
                targets = [i.optional_vars for i in node.items]
            if name not in names.stored_names([t for t in targets if t is not None]):
                continue
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and _returns_target(node.value, name)):
                return False
            found = True
    return found


def _returns_target(value, name: str) -> bool:
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return False
    qual = _attr_path(value.func)
    spec = _IN_PLACE_RESULT.get(qual)
    if spec is None:
        return False
    pos, kw = spec
    arg = next((k.value for k in value.keywords if k.arg == kw), None)
    if arg is None and len(value.args) > pos:
        arg = value.args[pos]
    return isinstance(arg, ast.Name) and arg.id == name


def _attr_path(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join(reversed(parts))
