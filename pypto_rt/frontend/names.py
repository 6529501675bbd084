"""Which local names a block of statements binds, reads, and reads before binding (upward-exposed uses).

These are the facts region outlining needs: a region's parameters are the names it may read before it
binds them (and that the host has bound); its results are the names it binds that are read afterwards.
Nested scopes (lambdas, comprehensions, nested defs) bind nothing in the enclosing function; the names
they read from it count as reads.
"""
from __future__ import annotations

import ast

_NESTED = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def stored_names(nodes) -> set[str]:
    """Names bound by `nodes` in the enclosing function scope."""
    out: set[str] = set()
    for node in _as_list(nodes):
        _stored(node, out)
    return out


def _stored(node, out: set[str]) -> None:
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        out.add(node.id)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.add(node.name)
        return
    elif isinstance(node, _NESTED):
        return
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            out.add((alias.asname or alias.name).split(".")[0])
    elif isinstance(node, ast.ExceptHandler) and node.name:
        out.add(node.name)
    elif isinstance(node, ast.NamedExpr):
        out.add(node.target.id)
    for child in ast.iter_child_nodes(node):
        _stored(child, out)


def loaded_names(nodes) -> set[str]:
    """Names read by `nodes` (including reads from nested scopes of names they do not bind themselves)."""
    out: set[str] = set()
    for node in _as_list(nodes):
        _loaded(node, out)
    return out


def _loaded(node, out: set[str]) -> None:
    if isinstance(node, ast.Name):
        if isinstance(node.ctx, ast.Load) or isinstance(node.ctx, ast.Del):
            out.add(node.id)
        return
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        out.add(node.target.id)
    if isinstance(node, _NESTED) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        inner: set[str] = set()
        for child in ast.iter_child_nodes(node):
            _loaded(child, inner)
        out |= inner - _own_bindings(node)
        return
    for child in ast.iter_child_nodes(node):
        _loaded(child, out)


def _own_bindings(node) -> set[str]:
    if isinstance(node, ast.Lambda) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        if not isinstance(node, ast.Lambda):
            names |= stored_names(node.body)
        return names
    return {n.id for gen in node.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)}


def exposed_reads(stmts, defined: set[str] | None = None) -> set[str]:
    """Names that `stmts` may read before binding them, on some path (loops may carry values around)."""
    exposed: set[str] = set()
    _exposed_block(_as_list(stmts), set(defined or ()), exposed)
    return exposed


def _exposed_block(stmts, defined: set[str], exposed: set[str]) -> set[str]:
    for stmt in stmts:
        defined = _exposed_stmt(stmt, defined, exposed)
    return defined


def _exposed_stmt(stmt, defined: set[str], exposed: set[str]) -> set[str]:
    def reads(*nodes):
        exposed.update(loaded_names([n for n in nodes if n is not None]) - defined)

    if isinstance(stmt, ast.Assign):
        reads(stmt.value, *stmt.targets)
        return defined | stored_names(stmt.targets)
    if isinstance(stmt, ast.AugAssign):
        reads(stmt.value, stmt.target)
        return defined | stored_names(stmt.target)
    if isinstance(stmt, ast.AnnAssign):
        reads(stmt.value, stmt.target)
        return defined | stored_names(stmt.target) if stmt.value is not None else defined
    if isinstance(stmt, ast.If):
        reads(stmt.test)
        then = _exposed_block(stmt.body, set(defined), exposed)
        other = _exposed_block(stmt.orelse, set(defined), exposed)
        return then & other
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        reads(stmt.iter)
        _exposed_block(stmt.body, defined | stored_names(stmt.target), exposed)
        _exposed_block(stmt.orelse, set(defined), exposed)
        return defined
    if isinstance(stmt, ast.While):
        reads(stmt.test)
        _exposed_block(stmt.body, set(defined), exposed)
        _exposed_block(stmt.orelse, set(defined), exposed)
        return defined
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        for item in stmt.items:
            reads(item.context_expr)
            if item.optional_vars is not None:
                defined = defined | stored_names(item.optional_vars)
        return _exposed_block(stmt.body, defined, exposed)
    if isinstance(stmt, ast.Try):
        _exposed_block(stmt.body, set(defined), exposed)
        for handler in stmt.handlers:
            _exposed_block(handler.body, set(defined), exposed)
        _exposed_block(stmt.orelse + stmt.finalbody, set(defined), exposed)
        return defined
    reads(stmt)
    return defined | stored_names(stmt)


def _as_list(nodes) -> list:
    if nodes is None:
        return []
    return list(nodes) if isinstance(nodes, (list, tuple)) else [nodes]
