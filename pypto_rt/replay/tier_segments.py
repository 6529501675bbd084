"""The compiled tier of a replay that communicates or calls kernel blocks as they are: its runs of torch calls between
those lines are compiled one by one; the communication lines and block calls stay Python and run in program order.

A communicating replay (replay.comm_block) is straight-line code in which recorded `pld` effects (`comm<N>(...)`:
window stores, puts, notifies, waits), the numbers they take (row counts read with `.item()` from data the run
computed) and arithmetic on numbers stand between runs of plain torch calls. Each run of at least
`policy.tier_min_segment_calls` lines is a *segment*: a function of the names it reads that earlier lines made
(tensors, tensor constants, integers) returning the names it makes that later lines read. It is traced and compiled
as replay.tier compiles a whole body (make_fx, inductor; integers symbolic, tensor sizes static; in-place writes into
windows and outputs land in their memory). The tiered replay is the replay with each segment's lines replaced by a
call of its compiled function; everything else runs as recorded, in the same order (a run of communication lines
and reads as one call, guarded once: replay.comm_run). A kernel block called as it is
(replay.opaque: its course follows data, e.g. a loop bounded by a count the call computed) ends a run the
same way: it runs once, in order, in the capture call too, and the torch lines around it are compiled.

The check never runs a communication effect twice: the segments are built from a *capture call*, an ordinary
replayed call (its communication runs once, in order, as any replay's) that copies each segment's inputs just
before the segment runs (memory shared between inputs stays shared). Then each segment is compiled and run twice on
fresh copies of its own snapshot, replayed and compiled: results and inputs afterwards must agree (replay.tier's
tolerance), results must have the replay's strides and alias the same inputs. Live memory and peers are never
touched. A segment that fails to compile or to agree keeps the whole replay (FAILED, naming the segment); one taking
a number that is not an integer, or inputs over `tier_max_copy_bytes` (with the copies held for earlier segments),
stays replayed, and so does one whose traced graph writes a window (it may write an input back whole, over a peer's).
A segment calls inductor's code without compile_fx's wrappers where its graph allows (replay.tier_graph's direct
call), else, or where the direct call disagrees in the check, through them.
replay.tier's trial then times whole calls (waits for peers included; the minimum over its calls counts) and keeps
the faster. Each rank decides alone: compiled or replayed, a rank's communication runs in the same order.

A long replay that does not communicate (issue 17: inductor's fusion search makes a cold build grow about quadratically
with a graph's length) is split the same way by length: a run of more than `policy.tier_max_segment_calls` torch lines
is cut into chunks of at most that many, each cut where the fewest temporaries cross (between unrolled tiles: none).
Those segments take the rows of their inputs that they touch (replay.tier_rows; tiles on other rows are then the same
graph, found in inductor's FX-graph cache), K steps and tiles of a matmul are joined in each (replay.tier_passes), and
the tiered replay is also checked as a whole against the replay on a copy of the capture call's inputs.
"""
from __future__ import annotations

import ast
import time

import torch

from pypto_rt import config
from pypto_rt.collective import process
from pypto_rt.replay.guards import GUARD_MISS
from pypto_rt.replay import comm_run, tier_process, tier_rows
from pypto_rt.replay.tier_copies import Held, snapshot
from pypto_rt.replay.passes import BOUNDARY_CALL, compile_trace
from pypto_rt.replay.tier_passes import rewrite
from pypto_rt.replay.tier_source import (Untierable, _function, _is_guard, _names, _reads_before, _reads_data,
                                         _tensor_of)

_PYTHON, _TORCH = "python", "torch"


def segmented(source: str, constants: dict, why_not: str | None, min_calls: int,
              max_calls: int = 0) -> Segmented | None:
    """The segments of a replay entry found not compilable as a whole (`why_not`) because it communicates or calls
    kernel blocks as they are, or of one compilable as a whole whose torch lines are more than `max_calls` (0: no
    limit; a long replay's cold build grows about quadratically with its length: inductor's fusion search), cut by
    length; None for any other replay (a short one compiled whole, or neither a communication line nor a block
    call where `why_not` is given)."""
    statements = ast.parse(source).body[0].body
    if why_not:
        # (its runs are not cut by length: a segment given a window's rows would not be seen to write a window)
        return Segmented(source, constants, min_calls, reason=why_not) \
            if any(_calls(s, BOUNDARY_CALL) for s in statements) else None
    if max_calls <= 0 or _lines(statements) <= max_calls:
        return None
    split = Segmented(source, constants, min_calls, max_calls, communicates=False)
    return split if split.why_not is None and len(split.segments) > 1 else None


class TorchRun:
    """A run of torch lines between communication lines: `_seg<index>(*inputs) -> outputs`."""
    __slots__ = ("index", "statements", "inputs", "outputs", "dropped", "replayed", "kept", "constants", "rows")

    def __init__(self, index: int, statements: list, inputs: list, outputs: list, dropped: list, constants: dict,
                 rows: dict | None = None):
        self.index, self.statements, self.inputs, self.outputs = index, statements, inputs, outputs
        self.rows = rows or {}   # input -> (first row, end row): it is given that view (replay.tier_rows)
        self.dropped = dropped   # inputs it deletes: the tiered replay deletes them after the call
        self.constants = constants
        self.replayed = compile_trace(self.source(inputs), constants, f"<pypto-rt tier segment {index}>")
        self.kept = None         # once built: why it stays replayed in the tiered replay, "" when compiled

    @property
    def name(self) -> str:
        first, last = self.statements[0].lineno, self.statements[-1].lineno
        return f"segment {self.index} (replay lines {first}-{last})"

    def source(self, params: list) -> str:
        back = ast.parse(f"return ({''.join(o + ', ' for o in self.outputs)})").body
        return _function(f"_seg{self.index}", ", ".join(params), self.statements + back)


class Segmented:
    """A replay split into parts: Python lines (communication, kernel blocks called as they are, numbers, short runs
    of torch lines) and segments, in program order (see the module text)."""

    def __init__(self, source: str, constants: dict, min_calls: int, max_calls: int = 0, communicates: bool = True,
                 reason: str = "it communicates"):
        fn = ast.parse(source).body[0]
        self.communicates = communicates   # (else a long replay split by length: the whole call is checked too)
        self.name, self.params = fn.name, [a.arg for a in fn.args.args]
        self.constants = constants
        self.traced = {k: _tensor_of if v is torch.tensor else v for k, v in constants.items()}   # (symbolic ints)
        last_guard = max((i for i, s in enumerate(fn.body) if _is_guard(s)), default=-1)
        end = max(last_guard + 1, _reads_before(fn.body, set(self.params) | set(constants)))
        self.prologue = fn.body[:end]
        self.parts: list = []   # lists of Python statements and Segments, in order
        self.segments: list[TorchRun] = []
        self.lines = sum(1 for s in fn.body[end:] if not isinstance(s, ast.Delete))
        self.why_not = None
        try:
            self._split(fn.body[end:], min_calls, max_calls)
        except Untierable as e:
            self.why_not = str(e)
        if self.why_not is None and not self.segments:
            # (`reason`: why the replay is not compiled whole, replay.entry's, naming the lines that stay Python)
            self.why_not = (f"{reason}, and no run of torch calls between those lines is {min_calls} lines long "
                            f"(policy.tier_min_segment_calls)")

    def _split(self, statements: list, min_calls: int, max_calls: int) -> None:
        read = {n for s in self.prologue for n in _names(s, ast.Store)}
        parts = _merge([[_PYTHON if kind == _TORCH and _lines(run) < min_calls else kind, run]
                        for kind, run in _runs(statements, set(read))])
        parts = [[kind, chunk] for kind, run in parts
                 for chunk in (_chunks(run, max_calls) if kind == _TORCH else [run])]
        outer = set(self.params) | read   # names the tiered replay's own lines define
        later = [set() for _ in parts] + [set()]
        for i in range(len(parts) - 1, -1, -1):
            later[i] = later[i + 1] | {n for s in parts[i][1] for n in _names(s, ast.Load)}
        for i, (kind, run) in enumerate(parts):
            if kind == _PYTHON:
                kept = []
                for stmt in run:
                    stmt = _kept_deletes(stmt, outer)
                    if stmt is not None:
                        kept.append(stmt)
                        outer |= set(_names(stmt, ast.Store))
                self.parts.append(kept)
                continue
            segment = self._segment(len(self.segments), run, outer, later[i + 1])
            self.segments.append(segment)
            self.parts.append(segment)
            outer |= set(segment.outputs)

    def _segment(self, index: int, run: list, outer: set, read_later: set) -> TorchRun:
        made, inputs, dropped = [], {}, []
        for stmt in run:
            for name in _names(stmt, ast.Load) + _names(stmt, ast.Del):
                if name in made or name in inputs:
                    continue
                if name in outer or isinstance(self.constants.get(name), torch.Tensor):
                    inputs[name] = None   # (a tensor constant is an input too: the check runs on copies of it)
            if isinstance(stmt, ast.Delete):
                dropped += [n for n in _names(stmt, ast.Del) if n in outer]
            made += [n for n in _names(stmt, ast.Store) if n not in made]
        outputs = [n for n in made if n in read_later]
        run, rows = (run, {}) if self.communicates else tier_rows.rebased(run, list(inputs))
        return TorchRun(index, run, list(inputs), outputs, dropped, self.traced, rows)

    def function(self, segments: dict):
        """The replay with segment k's lines replaced by a call of `segments[k]`."""
        body, runs = list(self.prologue), {}
        for i, part in enumerate(self.parts):
            if type(part) is not TorchRun:   # (its communication lines and reads run as one: replay.comm_run)
                statements, fused = comm_run.fused(part, self.constants, f"_run{i}_")
                body += statements
                runs.update(fused)
                continue
            given = [f"{n}[{part.rows[n][0]}:{part.rows[n][1]}]" if n in part.rows else n for n in part.inputs]
            call = f"_seg{part.index}({', '.join(given)})"
            body += ast.parse(f"{''.join(o + ', ' for o in part.outputs)}= {call}" if part.outputs else call).body
            if part.dropped:
                body += ast.parse(f"del {', '.join(part.dropped)}").body
        names = {**runs, **{f"_seg{k}": fn for k, fn in segments.items()}}
        source = _function(self.name, ", ".join(self.params), body)
        return compile_trace(source, {**self.constants, **names}, "<pypto-rt tiered replay, segmented>")

    def describe(self) -> str:
        """The split as PYPTO_STATS shows it with the tier."""
        lines = sum(_lines(s.statements) for s in self.segments)
        runs = "between communication lines" if self.communicates else "(a long replay, cut by length)"
        text = f"segmented: {len(self.segments)} runs of torch lines {runs} ({lines} of {self.lines} lines)"
        if any(s.kept is None for s in self.segments):
            return text
        kept = "".join(f"; {s.name} kept replayed: {s.kept}" for s in self.segments if s.kept)
        return f"{text}, {sum(1 for s in self.segments if not s.kept)} compiled{kept}"


def _runs(statements: list, numbers: set) -> list:
    """[kind, statements] runs: Python (communication, reads of data, numbers) or torch lines; a `del` goes with the
    run before it. `numbers`: names holding numbers (grows with the Python lines)."""
    runs: list = []
    for stmt in statements:
        if isinstance(stmt, ast.Delete) and runs:
            runs[-1][1].append(stmt)
            continue
        python = (isinstance(stmt, (ast.If, ast.Return, ast.Delete)) or _reads_data(stmt) or _calls(stmt, BOUNDARY_CALL)
                  or (not any(isinstance(n, ast.Call) for n in ast.walk(stmt))
                      and set(_names(stmt, ast.Load)) <= numbers))
        if python:
            numbers.update(_names(stmt, ast.Store))
        kind = _PYTHON if python else _TORCH
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(stmt)
        else:
            runs.append([kind, [stmt]])
    return runs


def _chunks(run: list, max_calls: int) -> list[list]:
    """`run` (torch lines) cut into chunks of at most `max_calls` lines (0: whole), each cut where the fewest names
    the run made are live across it (the replay deletes a name after its last use: between unrolled tiles, none),
    the latest such place in the chunk's second half."""
    if max_calls <= 0 or _lines(run) <= max_calls:
        return [run]
    live, after = set(), []   # after[i]: how many names made in the run are live after statement i
    for stmt in run:
        if isinstance(stmt, ast.Delete):
            live -= set(_names(stmt, ast.Del))
        else:
            live |= set(_names(stmt, ast.Store))
        after.append(len(live))
    chunks, start = [], 0
    while _lines(run[start:]) > max_calls:
        ends, lines = [], 0   # (candidate cuts: after a statement, its dels included)
        for i in range(start, len(run)):
            lines += not isinstance(run[i], ast.Delete)
            if lines > max_calls:
                break
            if lines * 2 >= max_calls and (i + 1 == len(run) or not isinstance(run[i + 1], ast.Delete)):
                ends.append(i + 1)
        end = min(reversed(ends), key=lambda e: after[e - 1]) if ends else start + max_calls
        chunks.append(run[start:end])
        start = end
    return chunks + [run[start:]]


def _lines(run: list) -> int:
    return sum(1 for s in run if not isinstance(s, ast.Delete))


def _merge(runs: list) -> list:
    merged: list = []
    for kind, run in runs:
        if merged and merged[-1][0] == kind:
            merged[-1][1] += run
        else:
            merged.append([kind, list(run)])
    return merged


def _kept_deletes(stmt, outer: set):
    """`stmt`, a `del` only of names the tiered replay's own lines define (a segment's inner names are gone)."""
    if not isinstance(stmt, ast.Delete):
        return stmt
    names = [n for n in _names(stmt, ast.Del) if n in outer]
    return ast.parse(f"del {', '.join(names)}").body[0] if names else None


def _calls(stmt, pattern) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and pattern.fullmatch(n.func.id)
               for n in ast.walk(stmt))


# -- the capture call, the build --------------------------------------------------------------------------------
def capturing(tier, replay, policy, background: bool):
    """The function this call runs to start `tier`'s build: the replay, copying each segment's inputs before it
    runs; after the call, the build (on this thread, or queued for the tier's worker). `replay` when another call
    started it already."""
    from pypto_rt.replay import tier as base

    with tier.lock:
        if tier.state != base.REPLAY or tier.why:
            return replay
        tier.state, tier.started, tier.stats = base.COMPILING, time.perf_counter(), config.STATS.get() == "1"
        tier._describe()
    segmented, threads, max_bytes = tier.segments, torch.get_num_threads(), policy.tier_max_copy_bytes
    timeout_s = policy.tier_timeout_s
    snapshots: dict = {}
    held = Held()   # the segments' copies the capture call holds together, within tier_max_copy_bytes
    run = segmented.function({s.index: _capture(s, snapshots, max_bytes, held) for s in segmented.segments})
    whole: list = []   # a long replay split by length (no communication): its call's inputs, checked as a whole

    def again():   # (the call did not get through: a later call captures)
        with tier.lock:
            if tier.state == base.COMPILING:
                tier.state, tier.started = base.REPLAY, 0.0
                tier._describe()

    def call(*args):
        if not segmented.communicates:
            try:
                whole[:] = [snapshot(list(args), max_bytes)]
            except Untierable as e:
                whole[:] = [str(e)]
        try:
            outputs = run(*args)
        except BaseException:
            again()
            raise
        if outputs is GUARD_MISS or len(snapshots) < len(segmented.segments):
            again()
            return outputs
        job = lambda: _build(tier, replay, snapshots, threads, timeout_s, background, whole)   # noqa: E731
        if not background:
            job()
        elif not base._submit(job):
            again()
        return outputs
    return call


def _capture(segment: TorchRun, snapshots: dict, max_bytes: int, held: Held):
    def capture(*inputs):
        snapshots[segment.index] = _snapshot(segment, inputs, max_bytes, held)
        return segment.replayed(*inputs)
    return capture


class _Kept(Untierable):
    """The segment stays replayed (not a failure of the whole build); the message says why."""


def _snapshot(segment: TorchRun, inputs: tuple, max_bytes: int, held: Held):
    """(copies of a segment's inputs, integers as they are; the names of those that are windows), or why it stays
    replayed: no room left by the copies held for earlier segments (`held`; an unwritten tensor shares its copy)."""
    for name, value in zip(segment.inputs, inputs):
        if not isinstance(value, torch.Tensor) and type(value) is not int:
            return f"it takes a {type(value).__name__} ({name}); only tensors and integers go to a compiled graph"
    window = [isinstance(v, torch.Tensor) and bool(process.window_of(v)) for v in inputs]
    try:
        copies = snapshot([v if isinstance(v, torch.Tensor) else None for v in inputs], max_bytes, held,
                          shared=[not w for w in window])
    except Untierable as e:
        return str(e)
    return [v if c is None else c for v, c in zip(inputs, copies)], {n for n, w in zip(segment.inputs, window) if w}


def _build(tier, replay, snapshots: dict, threads: int, timeout_s: float, idle: bool, whole: list = ()) -> None:
    """Compile (in the compile process of `idle` priority, stopped `timeout_s` after the compile was asked for)
    and check every segment that can be (see the module text), then hand the tiered replay (or why not) to `tier`;
    `whole`: [the capture call's inputs (or why they were not copied)] of a long replay that does not communicate:
    the tiered replay is checked against the replay on them as replay.tier checks a whole body. Never raises."""
    from pypto_rt.replay import tier as base

    if tier.state != base.COMPILING:   # (timed out while queued)
        return
    base._use_our_cache()
    t0, deadline = time.perf_counter(), tier.started + timeout_s
    segmented, compiled = tier.segments, {}
    tiered, problem = None, None
    for segment in segmented.segments:
        snapshot = snapshots.pop(segment.index)   # (its copies released once it is built)
        if isinstance(snapshot, str):
            segment.kept, compiled[segment.index] = snapshot, segment.replayed
            continue
        try:
            join = not segmented.communicates
            compiled[segment.index], problem = _checked(
                segment, _compile(segment, *snapshot, threads, deadline, idle, join=join, reorder=True),
                snapshot[0])
            if problem is not None and compiled[segment.index].joined:   # (reordered sums past the tolerance)
                compiled[segment.index], problem = _checked(
                    segment, _compile(segment, *snapshot, threads, deadline, idle, join=False, reorder=False),
                    snapshot[0])
        except Untierable as e:   # (_Kept, raised where the segment was traced)
            segment.kept, compiled[segment.index] = str(e), segment.replayed
            continue
        except Exception as e:   # (whatever the compiler raises: the replay stays)
            problem = base._failure(e, timeout_s)
        if problem is not None:
            problem = f"{segment.name}: {problem}"
            break
        segment.kept = ""
    if problem is None:
        tiered = segmented.function(compiled)
        tiered.outside = 0   # (per segment: see each compiled segment's `outside`)
        if whole and isinstance(whole[0], list):
            problem = base._mismatch(replay, tiered, whole[0])
            problem = f"the segments called in a row: {problem}" if problem else None
        tiered = None if problem else tiered
    tier._built(replay, tiered, problem, t0)


def _compile(segment: TorchRun, snapshot: list, windows: set, threads: int, deadline: float, idle: bool,
             join: bool = False, reorder: bool = False):
    """`(*inputs) -> outputs`: the segment compiled (in the compile process, before `deadline`) for its snapshot's
    integers as symbols (tensors first in the graph), replayed for integers outside what the graph assumed;
    Untierable when its graph writes one of `windows`. `join`, `reorder`: replay.tier_passes.rewrite's (as
    replay.tier runs it; `joined` says how many rewrites may have reordered sums)."""
    from pypto_rt.replay import tier as base

    tensors = [i for i, v in enumerate(snapshot) if isinstance(v, torch.Tensor)]
    order = tensors + [i for i, v in enumerate(snapshot) if i not in tensors]
    names = [segment.inputs[i] for i in order]
    traced = compile_trace(segment.source(names), segment.constants, f"<pypto-rt tier segment {segment.index}, traced>")
    graph, direct, assumed, joined = tier_process.compile_apart(
        traced, None, base._copy([snapshot[i] for i in tensors]), tuple(snapshot[i] for i in order[len(tensors):]),
        threads, ("pypto_rt.replay.tier_segments:prepare", (names, windows, join, reorder)), deadline, idle)
    replayed = segment.replayed

    def calling(call):
        def run(*inputs):
            graph_inputs = [inputs[i] for i in order]
            if assumed is not None and not assumed(graph_inputs):
                run.outside += 1
                return replayed(*inputs)
            return call(graph_inputs)
        run.outside, run.wrapped = 0, None
        return run
    wrapped = calling(lambda graph_inputs: graph(*graph_inputs))
    wrapped.joined = joined or 0
    if direct is None:
        return wrapped
    run = calling(direct)
    run.wrapped, run.joined = wrapped, wrapped.joined
    return run


def prepare(names: list, windows: set, join: bool, reorder: bool, graph) -> int:
    """_Kept when the traced `graph` (inputs named `names`) writes one of `windows`; else replay.tier_passes.rewrite
    (`join`: K steps and tiles joined too). Run in the compile process."""
    written = [names[p] for p in sorted(_written_inputs(graph)) if names[p] in windows]
    if written:
        raise _Kept(f"it writes the window {written[0]}, which peers write meanwhile (a compiled graph may "
                    "write an input back whole)")
    return rewrite(graph, join, reorder)


def _checked(segment: TorchRun, compiled, snapshot: list) -> tuple:
    """(`compiled`, or its wrapped call where the direct one disagrees (replay.tier_graph), why it does not do what
    the replayed segment does, or None)."""
    problem = _mismatch(segment, compiled, snapshot)
    if problem is not None and compiled.wrapped is not None:
        compiled = compiled.wrapped
        problem = _mismatch(segment, compiled, snapshot)
    return compiled, problem


def _written_inputs(graph) -> set[int]:
    """Positions of the graph inputs its aten ops write (through views of them too)."""
    inputs = [node for node in graph.graph.nodes if node.op == "placeholder"]
    bases = {node: i for i, node in enumerate(inputs)}   # node -> the input whose memory it is (or views)
    written = set()
    for node in graph.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        for i, arg in enumerate(schema.arguments):
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write:
                written.update(bases[v] for v in (value if isinstance(value, (list, tuple)) else (value,))
                               if v in bases)
        first = node.args[0] if node.args else None
        if schema.returns and schema.returns[0].alias_info is not None and first in bases:
            bases[node] = bases[first]
    return written


def _mismatch(segment: TorchRun, compiled, snapshot: list) -> str | None:
    """Why `compiled` does not do what the replayed segment does on fresh copies of `snapshot`, or None."""
    from pypto_rt.replay import tier as base

    def fresh():
        copies = base._copy([v if isinstance(v, torch.Tensor) else None for v in snapshot])
        return [v if c is None else c for v, c in zip(snapshot, copies)]
    want_in, got_in = fresh(), fresh()
    want, got = segment.replayed(*want_in), compiled(*got_in)
    if len(got) != len(want):
        return f"its compiled form gives {len(got)} results, the replay {len(want)}"
    for name, w, g in zip(segment.outputs, want, got):
        problem = base._differs(w, g) or _layout(w, g, want_in, got_in)
        if problem:
            return f"its compiled {name} differs from the replay's: {problem}"
    for name, w, g in zip(segment.inputs, want_in, got_in):
        problem = base._differs(w, g) if isinstance(w, torch.Tensor) else None
        if problem:
            return f"its input {name} differs afterwards from the replay's: {problem}"
    return None


def _layout(want: torch.Tensor, got: torch.Tensor, want_in: list, got_in: list) -> str | None:
    """Why `got` could not stand for `want` in the lines after the segment (strides, memory shared with an input)."""
    if want.stride() != got.stride():
        return f"strides {got.stride()} instead of {want.stride()}"

    def aliased(t, inputs):
        return [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
                and x.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()]
    if aliased(want, want_in) != aliased(got, got_in):
        return "it does not share memory with the same inputs"
    return None
