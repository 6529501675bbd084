"""Passes over the recorded calls, then Python source: constants folded, common calls shared, window copies
merged, dead calls dropped, repeated arithmetic hoisted; `compile_trace` makes the function."""
from __future__ import annotations

import ast
import re
import types

from pypto_rt.replay.comm_block import EFFECT_PREFIX
from pypto_rt.replay.guards import Guard
from pypto_rt.replay.opaque import CALL_PREFIX
from pypto_rt.replay.records import Call, Lit, Ref, Sym


def generate(rec, results: list[str], fn_name: str = "replay") -> str:
    """Recorder `rec`'s trace as one function of the entry tensors, returning the tensors named in `results`.

    Two clean-ups: a call repeating an earlier one (same function, same arguments, their memory unchanged
    since) reuses its result, unless either result is later written; a call whose result nothing needs and
    that changes nothing is left out. Each tensor the replay makes is released after its last use."""
    calls = _fold(rec, _whole_windows(_dedupe(rec.recorded, rec.storage_of, rec.volatile), set(results)),
                  set(results))
    calls = _early_numbers(calls, rec.storage_of)
    needed = set(results)
    keep = []
    for call in reversed(calls):
        if call.effect or call.out in needed:
            keep.append(call)
            needed.update(call.reads)
    keep = _assign_windows(keep[::-1], set(results))
    rec.calls = len(keep)   # (the recorder reports how many calls its replay makes)
    body = _with_releases(keep, {call.out for call in keep if call.out in rec.made} - set(results))
    folded = [f"{n} {list(rec.made[n].shape)} {rec.made[n].dtype}" for n in sorted(needed & rec.made.keys())
              if n in rec.constants]
    if folded:
        body.insert(0, "# tensors computed from constants when recorded, kept: " + ", ".join(folded))
    body[:0] = [item.line() if type(item) is Guard else item for item in rec.prologue]
    used = sorted({t for call in keep for t in call.code if type(t) is Lit}, key=lambda n: int(n[1:]))
    body[:0] = [f"# {n} = {rec.constants[n]!r}" for n in used]
    body.append(f"return ({', '.join(results)}{',' if results else ''})")
    return _hoist_common(f"def {fn_name}({', '.join(rec.params)}):\n" + "\n".join("    " + line for line in body)
                         + "\n", rec.policy.hoist_lines)


_NAME = re.compile(r"[A-Za-z_]\w*")
# a call no compiled segment takes: a communication effect or a kernel block called as it is (replay.opaque)
BOUNDARY_CALL = re.compile(rf"(?:{EFFECT_PREFIX}|{CALL_PREFIX})\d+")


def _early_numbers(calls: list[Call], storage_of: dict[str, int]) -> list[Call]:
    """A number read from computed data (`s3 = v9[(0, 0)].item()`) between two torch calls ends a compiled tier's
    run of torch lines there (replay.tier_segments): a loop reading a count per step (`pl.range` with `pl.read` in
    its body) would make a segment per step. Such a read moves up to just after an earlier Python line (another
    read, a communication line, a kernel block called as it is) where it may: past no call that makes a tensor or
    number it reads, writes memory it reads (by storage: any view), or has an effect whose writes are not known
    (communication, a kernel block, chance), nor past a check when it reads at a computed place (at a constant
    place it cannot fail). The loop's reads then come first and its steps' torch lines are one run, as if the
    kernel had read every count before its loop. A read already beside a Python line, or with none to join, stays."""
    out: list[Call] = []
    for index, call in enumerate(calls):
        at = len(out)
        following = calls[index + 1] if index + 1 < len(calls) else None
        if call.kind == "number" and at and not _python(out[-1]) and following is not None \
                and not _python(following):
            computed_at = {n for token in call.code if type(token) is Sym for n in _NAME.findall(token)}
            needs, storages = set(call.reads) | computed_at, {storage_of.get(r) for r in call.reads}
            lowest = at
            while lowest and not _must_follow(out[lowest - 1], needs, storages, bool(computed_at)):
                lowest -= 1
            at = next((p for p in range(lowest, at) if p == 0 or _python(out[p - 1])), at)
        out.insert(at, call)
    return out


def _python(call: Call) -> bool:
    """Whether the call stays a Python line in a compiled tier (a read of data, communication, a kernel block)."""
    return call.kind == "number" or BOUNDARY_CALL.fullmatch(call.code[0]) is not None


def _must_follow(earlier: Call, needs: set, storages: set, computed_at: bool) -> bool:
    if earlier.out in needs or earlier.kind == "number":   # (reads keep their order)
        return True
    if not earlier.effect or (earlier.kind == "check" and not computed_at):
        return False
    if not earlier.written_storages or None in storages:
        return True
    return not storages.isdisjoint(earlier.written_storages)


def _with_releases(calls: list[Call], tensors: set[str]) -> list[str]:
    """The calls' statements, each followed by `del` of the `tensors` (names the replay assigns) no later call
    reads: their memory goes back to the allocator while the replay runs, so later calls reuse it warm instead of
    touching fresh pages (a replay holding every temporary to its end makes a peak of all of them)."""
    last = {}
    for index, call in enumerate(calls):
        for name in call.reads:
            last[name] = index
        if call.out in tensors:
            last.setdefault(call.out, index)
    ends: dict[int, list[str]] = {}
    for name in tensors:
        ends.setdefault(last[name], []).append(name)
    body = []
    for index, call in enumerate(calls):
        body.append(call.statement())
        if index in ends:
            body.append("del " + ", ".join(sorted(ends[index], key=lambda n: int(n[1:]))))
    return body


def _fold(rec, calls: list[Call], results: set[str]) -> list[Call]:
    """Constants: a call computed from literals and constants alone (nothing from an entry tensor, an outside
    tensor or chance), whose memory nothing writes later, gives the same tensor every run: the recorded one
    is kept (as a global of the replay function) instead of the call. Not for the memory of returned tensors
    (views too): the caller may write those."""
    keep_fresh = {s for call in calls for s in call.written_storages} | {
        rec.storage_of[r] for r in results if r in rec.storage_of}   # written, or returned (also as a view)
    out = []
    for call in calls:
        name = call.out
        if (name is not None and not call.effect and not call.tainted and name in rec.made
                and rec.storage_of[name] not in keep_fresh):
            rec.constants[name] = rec.made[name]
            continue
        out.append(call)
    return out


def _whole_windows(calls: list[Call], results: set) -> list[Call]:
    """`v4 = a3[0:1, :]` covering all of a3 (the shapes of a specialisation are static) is a3 itself: later calls
    read a3 (a subscript costs a few µs of index parsing; a subscript assignment to it becomes `copy_`)."""
    alias: dict[str, str] = {}
    out = []
    for call in calls:
        if alias:
            call.renamed(alias)
        if call.kind == "window" and call.whole and call.out is not None and call.out not in results \
                and len(call.reads) == 1:
            alias[call.out] = call.reads[0]
            continue
        out.append(call)
    return out


def _assign_windows(calls: list[Call], results: set) -> list[Call]:
    """`v4 = a3[k]` then `copy_(v4, v3)`, with v4 used nowhere else, becomes `a3[k] = v3`: torch's subscript
    assignment copies into the same view (one call instead of two; the same bits)."""
    readers: dict[str, int] = {}
    for call in calls:
        for name in call.reads:
            readers[name] = readers.get(name, 0) + 1
    windows = {call.out: call for call in calls if call.kind == "window" and call.out not in results
               and readers.get(call.out) == 1}
    merged = set()
    for call in calls:
        if call.kind == "copy" and call.reads[0] in windows and call.reads[1] != call.reads[0]:
            window = windows[call.reads[0]]
            call.code = window.code + (" = ", Ref(call.reads[1]))
            call.reads = window.reads + call.reads[1:]
            merged.add(id(window))
    return [call for call in calls if id(call) not in merged]


def _dedupe(calls: list[Call], storage_of: dict[str, int], volatile: set = frozenset()) -> list[Call]:
    """Common subexpressions: a pure call equal to an earlier one, over memory not written in between, reuses
    the earlier result. Results that are written later (by name or, for fresh memory, through any view) keep
    their own call: sharing them would leak one's writes into the other. A call reading `volatile` memory (a
    window: peers write it unseen) keeps its own call too. Pure calls returning tuples (a sort) are shared like
    the others; an assert repeating an earlier one over unchanged memory is dropped (it cannot fail anew)."""
    written_names = {n for call in calls for n in call.written}
    written_storages = {s for call in calls for s in call.written_storages}
    version: dict[int, int] = {}
    seen: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    out = []
    for call in calls:
        if alias:
            call.renamed(alias)
        for s in call.written_storages:
            version[s] = version.get(s, 0) + 1
        name = call.out
        key = (call.code, tuple(version.get(storage_of.get(r), 0) for r in call.reads))
        if call.kind == "check":
            if key in seen:
                continue
            seen[key] = ""
        parts = call.kind == "parts"
        if name is not None and (name in storage_of or parts):
            shareable = ((parts or not call.effect) and name not in written_names
                         and not (call.fresh and storage_of[name] in written_storages)
                         and not (volatile and any(storage_of.get(r) in volatile for r in call.reads)))
            if shareable:
                earlier = seen.get(key)
                if earlier is not None:
                    alias[name] = earlier
                    continue
                seen[key] = name
        out.append(call)
    return out


def _hoist_common(source: str, hoist_lines: int) -> str:
    """Arithmetic on numbers (`(s1 + 1) * 8`: offsets computed from a value read from data, guarded and used in
    windows) computed more than once is computed once, into `c<n>`, just after the statement that makes the last
    name it reads (at the latest, just before the first statement that uses it).
    Only +, - and * of names and constants (no call, no division: nothing that could raise before a guard); a
    name assigned more than once in the function keeps its expressions where they are. Comments are kept. Linear
    in the function's size, but Python's ast is slow: a function beyond `hoist_lines` lines (a block making
    thousands of calls, whose own run dwarfs the arithmetic) is left as it is."""
    if source.count("\n") > hoist_lines:
        return source
    tree = ast.parse(source)
    fn = tree.body[0]
    assigned, defined = _assignments(fn)
    codes: dict[int, str] = {}     # id(BinOp node) -> its canonical text, for the pure-arithmetic ones
    counts: dict[str, int] = {}
    first: dict[str, tuple] = {}   # canonical text -> (index of the first statement using it, a node of it)
    for index, stmt in enumerate(fn.body):
        for node in ast.walk(stmt):
            if isinstance(node, ast.BinOp):
                code = _arithmetic_code(node, assigned, codes)
                if code is not None:
                    counts[code] = counts.get(code, 0) + 1
                    first.setdefault(code, (index, node))
    common = [c for c, n in counts.items() if n > 1]
    if not common:
        return source
    names = {code: f"c{i}" for i, code in enumerate(sorted(common, key=len, reverse=True))}   # outermost first

    class Replace(ast.NodeTransformer):
        def __init__(self, skip: str | None = None):
            self.skip = skip

        def visit_BinOp(self, node):
            code = codes.get(id(node))
            if code in names and code != self.skip:
                return ast.Name(names[code], ast.Load())
            return self.generic_visit(node)

    hoisted: dict[int, list] = {}
    for code in sorted(common, key=len):   # an inner expression (a part of an outer one) first
        index, node = first[code]
        # as early as its names allow: beside the reads that make them, not between torch lines (a Python line
        # there would cut a compiled tier's run: replay.tier_segments)
        index = min(index, max((defined.get(n.id, -1) + 1 for n in ast.walk(node) if isinstance(n, ast.Name)),
                               default=0))
        value = Replace(skip=code).visit(ast.BinOp(node.left, node.op, node.right))
        hoisted.setdefault(index, []).append(ast.Assign([ast.Name(names[code], ast.Store())], value))
    body = [Replace().visit(stmt) for stmt in fn.body]
    out = []
    for index, stmt in enumerate(body):
        out.extend(hoisted.get(index, ()))
        out.append(stmt)
    fn.body = out
    comments = [line for line in source.splitlines()[1:] if line.lstrip().startswith("#")]
    header = source.split("\n", 1)[0]
    return "\n".join([header] + comments + ["    " + _statement(stmt) for stmt in out]) + "\n"


def _assignments(fn: ast.FunctionDef) -> tuple[dict, dict]:
    """(name -> how many times the function assigns it, name -> index of the last statement assigning it)."""
    counts: dict[str, int] = {}
    at: dict[str, int] = {}
    for index, stmt in enumerate(fn.body):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                counts[node.id] = counts.get(node.id, 0) + 1
                at[node.id] = index
    return counts, at


def _statement(stmt: ast.stmt) -> str:
    """One statement of the function as one line: a guard as `if not (...): return _MISS`."""
    if isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Return):
        return f"if {ast.unparse(stmt.test)}: {ast.unparse(stmt.body[0])}"
    return ast.unparse(ast.fix_missing_locations(stmt))


_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


def _arithmetic_code(node, assigned: dict, codes: dict) -> str | None:
    """The canonical text of a +, -, * expression of names assigned at most once (or parameters) and numeric
    constants, memoised in `codes` by node; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id if assigned.get(node.id, 0) <= 1 else None
    if isinstance(node, ast.Constant):
        return repr(node.value) if type(node.value) in (int, float) else None
    if not isinstance(node, ast.BinOp) or type(node.op) not in _OPERATORS:
        return None
    known = codes.get(id(node))
    if known is not None:
        return known
    left = _arithmetic_code(node.left, assigned, codes)
    right = _arithmetic_code(node.right, assigned, codes) if left is not None else None
    if right is None:
        return None
    code = codes[id(node)] = f"({left} {_OPERATORS[type(node.op)]} {right})"
    return code


def compile_trace(source: str, constants: dict, file: str = "<pypto-rt replay>"):
    """The function `source` defines, with `constants` as its globals."""
    namespace = dict(constants)
    namespace["__builtins__"] = {"slice": slice}
    exec(compile(source, file, "exec"), namespace)
    return next(v for k, v in namespace.items() if isinstance(v, types.FunctionType) and k not in constants)
