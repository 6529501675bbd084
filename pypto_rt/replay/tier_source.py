"""A replay's source split for the compiled tier: the prologue (values read from data, the guards on them, numbers
computed from them) stays Python; the body is traced and compiled, taking the values it uses from the prologue
(carried) as parameters after its tensor arguments.
"""
from __future__ import annotations

import ast

import torch

from pypto_rt.replay.passes import compile_trace


class Untierable(Exception):
    """The replay is not compiled; the message says why."""


def _is_guard(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and any(isinstance(s, ast.Return) for s in stmt.body)


def _reads_data(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in ("tolist", "item") for n in ast.walk(stmt))


def _reads_before(statements: list, entry: set) -> int:
    """How many leading statements read values from data (`r0 = f0(a1, ...).tolist()`; a large tensor's view
    `r0 = f0(a1, ...)`, then `s3 = r0[7].item()`) or compute numbers from those alone (`s3 = r0[7]`,
    `c1 = s3 + 1`), guards among them: the replay's prologue, also where it has no guard. `entry`: the names a
    view of an entry tensor may use (parameters, globals)."""
    numbers: set[str] = set()
    end = 0
    for i, stmt in enumerate(statements):
        if _is_guard(stmt):
            end = i + 1
            continue
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            break
        loads = {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
        has_call = any(isinstance(n, ast.Call) for n in ast.walk(stmt.value))
        if _reads_data(stmt) or (not has_call and loads <= numbers):
            end = i + 1
            numbers.add(stmt.targets[0].id)
        elif not loads <= entry:   # (else a view of an entry tensor: the prologue's if a read follows)
            break
    return end


def split_source(source: str, constants: dict, args: list, rewrite=None):
    """(prologue function or None, body function of the tensor arguments then the carried values, the tensor
    arguments' positions, for each output the position of the argument it is (else -1), the carried names): the
    values read from data that the body uses (offsets, slot positions, expert ids) are carried from the prologue,
    which returns them, into the body as parameters. `rewrite(function AST, body statements)`: the body's
    statements to compile instead (replay.tier_family: integers as expressions of the arguments' sizes)."""
    fn = ast.parse(source).body[0]
    params = [a.arg for a in fn.args.args]
    last_guard = max((i for i, s in enumerate(fn.body) if _is_guard(s)), default=-1)
    end = max(last_guard + 1, _reads_before(fn.body, set(params) | set(constants)))
    prologue, body = fn.body[:end], fn.body[end:]
    if rewrite is not None:
        body = rewrite(fn, body)
    if any(_reads_data(s) for s in body):
        raise Untierable("its torch calls read back data they computed (.item()): kept as a replay (a compiled "
                         "graph would fix the recorded value)")
    read = [n.id for s in prologue for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    used = {n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    carried = list(dict.fromkeys(n for n in read if n in used))   # (in the order the prologue reads them)
    positions = [i for i, a in enumerate(args) if a is not None]
    if any(params[i] in used for i, a in enumerate(args) if a is None):
        raise Untierable("its body uses an argument that is not a tensor")
    returned = body[-1]
    if not isinstance(returned, ast.Return) or not isinstance(returned.value, ast.Tuple):
        raise Untierable("its replay does not end with a tuple of results")
    names = [e.id if isinstance(e, ast.Name) else "" for e in returned.value.elts]
    outputs_from = [params.index(n) if n in params else -1 for n in names]
    body_params = ", ".join([params[i] for i in positions] + carried)
    traced = {k: _tensor_of if v is torch.tensor else v for k, v in constants.items()}
    body_fn = compile_trace(_function("_tier_body", body_params, body), traced, "<pypto-rt tier body>")
    prologue_fn = None
    if prologue:
        gives = ast.parse(f"return ({''.join(n + ', ' for n in carried)})").body
        prologue_fn = compile_trace(_function("_tier_prologue", ", ".join(params), prologue + gives),
                                    constants, "<pypto-rt tier prologue>")
    return prologue_fn, body_fn, positions, outputs_from, carried


def _tensor_of(data, **kwargs) -> torch.Tensor:
    """`torch.tensor`, where a carried value traced as a symbolic integer stays symbolic (torch.tensor would fix
    it to the traced value)."""
    if isinstance(data, torch.SymInt):
        return torch.scalar_tensor(data, **kwargs)
    return torch.tensor(data, **kwargs)


def _names(stmt, ctx) -> list[str]:
    """The names `stmt` uses in context `ctx` (ast.Load, ast.Store, ast.Del), first use first."""
    return list(dict.fromkeys(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)))


def _function(name: str, params: str, body: list) -> str:
    lines = [ast.unparse(ast.fix_missing_locations(s)) for s in body]
    return f"def {name}({params}):\n" + "\n".join("    " + line.replace("\n", "\n    ") for line in lines) + "\n"
