"""Tiered execution: a replayed entry call that keeps running is compiled by the torch compiler and swapped in.

A replay (replay.entry) is straight-line torch: one call per tile op. Once a specialisation's replay is steady
(kept after its trial against the engine, then replayed `tier_after_replays` times), its function is traced to
an FX graph (`make_fx`, aten ops, in-place writes included) and compiled by inductor's `compile_fx` (C++ on CPU;
the same path emits Triton on CUDA). Not through dynamo: the replay already guards, and dynamo's own guards and
dispatch cost more than a small call.

Split: the replay's *prologue* (values read from data with `pl.read`, and the guards on them) stays Python and
runs first on every call; the rest, the *body*, is compiled. Values the prologue read that the body uses (offsets,
slot positions, expert ids) are *carried*: the prologue returns them and they are the graph's integer inputs,
traced as symbolic integers (make_fx tracing_mode="symbolic"; tensors keep static sizes), so one graph serves
every value. What tracing and inductor assumed of them (a range, `end == start + 1`, a value not 0 where a slice
would be the whole tensor) is checked per call; a call outside it runs the body replayed (`tiered.outside` counts
them). Measured on this CPU against 0-d/1-d index tensors (index_copy_ on the buffer): a write at a symbolic offset
is lowered as a pass over the whole written buffer, so a compiled cache write costs O(cache) where the replay costs
O(rows), and the trial keeps the replay for large buffers; index_copy_ is done in place only into a graph input
itself (not through the replay's views), which would need the body's slice writes rewritten as index ops.
Sizes: specialisations of one entry whose replays differ only in integers that follow their arguments' sizes (serving
batch buckets) form a family (replay.tier_family): the second one compiled gets a graph whose sizes are symbolic,
the later ones share it without a compile (each checked against its own replay, then timed); the first keeps its own.
A value carried that is not an integer (a float operand) keeps the replay. A replay that communicates (recorded
`pld` effects, replay.comm_block) or calls kernel blocks as they are (replay.opaque) is compiled segment by segment
between those lines, which stay Python (replay.tier_segments); so is a
replay of more than `tier_max_segment_calls` torch lines (its segments cut where no temporary crosses, between
unrolled tiles): inductor's fusion search grows about quadratically with a graph's length, segments linearly.

Per specialisation a `Tier` goes: replay -> compiling -> trial -> compiled, or failed / replay, with the reason
(PYPTO_STATS shows it with the replay's line). Every build runs in a compile process (replay.tier_process: the
replay's code and a copy of its inputs go there, the compiled code comes back through inductor's cache; killed at
`tier_timeout_s` and at exit). PYPTO_TIER=background (the default) hands the build to one daemon worker thread (a
bounded queue; calls go on replaying meanwhile, never waiting) and a compile process at nice 19, and only once
the replay has paid for a compile: `tier_after_replays` replays and `tier_after_replayed_ms` of replayed time, the
replay count times its fastest timed call (`Tier.due`), so a short run never compiles (replay.tier_worker: the
worker, its priority, and stopping it at exit); eager compiles at the first replay, the call waiting for it at most
`tier_timeout_s` (benchmarks, serving warm-up; in a compile process at normal priority); off never compiles.
Before the swap, the compiled body is checked against the replay on the inputs of the call it was built from (a
copy of their memory, views and sharing kept):
integer and boolean results bit for bit, floating ones within torch.testing's tolerance of their dtype (inductor
fuses and reorders: the last bits may differ). A mismatch, an error (a C++ compile error, a bug of inductor's
vector code, is retried once as scalar C++; its outer-loop fusion's KeyError once without fusion) or a compile
past `tier_timeout_s` keeps the replay. A verified build
then runs a trial: compiled and replayed calls alternate, timed, and the faster is kept (a tiny call loses to the
compiled call's fixed cost).

In-place writes into the caller's tensors (Out, InOut, scatters into caches) land in their memory: the traced graph
writes its inputs, and inductor's code writes them in place. Returned arguments come back as the caller's own
tensors. Inductor's code is called without compile_fx's wrappers where the graph allows (replay.tier_graph). The
compiled artifacts go to inductor's FX-graph cache in `<PYPTO_CACHE_DIR>/inductor` (unless TORCHINDUCTOR_CACHE_DIR
is set): a fresh process tracing the same body gets its compiled code from disk.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time

import torch

from pypto_rt import config
from pypto_rt.replay import tier_segments
from pypto_rt.replay.guards import GUARD_MISS
from pypto_rt.replay.policy import current_policy
from pypto_rt.replay import tier_family, tier_process
from pypto_rt.replay.tier_worker import ensure_worker as _ensure_worker, submit as _submit, wait_idle, where as _where
from pypto_rt.replay.tier_graph import tensor_constants
from pypto_rt.replay.tier_passes import rewrite
from pypto_rt.replay.tier_copies import copy as _copy, snapshot as _snapshot
from pypto_rt.replay.tier_source import Untierable, split_source

REPLAY, COMPILING, TRIAL, COMPILED, FAILED = "replay", "compiling", "trial", "compiled", "failed"


class Tier:
    """The compiled tier of one specialisation's replay. `pick` gives the function a call runs: `chosen` once
    decided (the replay or the compiled one; one attribute read on the hot path), else per state."""
    __slots__ = ("entry", "source", "constants", "state", "why", "compile_s", "tiered", "chosen", "started",
                 "trial_ns", "lock", "text", "stats", "segments", "call_ns", "families", "sizes")

    def __init__(self, entry: str, source: str, constants: dict, why_not: str | None = None, families=None):
        self.entry, self.source, self.constants = entry, source, constants
        self.families = families    # the entry's replay.tier_family.Families (None: every size compiles its own)
        self.sizes = ""             # how its sizes were compiled: shared with other sizes, or why not
        # a replay that communicates, or a long one, is compiled segment by segment (replay.tier_segments)
        policy = current_policy()
        self.segments = tier_segments.segmented(source, constants, why_not, policy.tier_min_segment_calls,
                                                policy.tier_max_segment_calls)
        if self.segments is not None:
            why_not = self.segments.why_not
        self.state, self.why = REPLAY, why_not or ""
        self.compile_s = 0.0
        self.tiered = None          # the verified compiled function (prologue, then the compiled body)
        self.chosen = None          # decided: every call runs this
        self.started = 0.0          # when compiling began (the timeout counts from it)
        self.trial_ns: tuple[list, list] = ([], [])   # (compiled, replayed) call times in the trial
        self.call_ns = 0            # the fastest replayed call timed before the trial (0: none yet): `due`
        self.lock = threading.Lock()
        self.stats = False          # print transitions (PYPTO_STATS=1 where the compile was asked for)
        self.text = ""
        if why_not:
            self._settle(REPLAY, why_not, decided=None)
        self._describe()

    # -- the hot path ------------------------------------------------------------------------------------------
    def pick(self, replay, args: list, steady: bool, policy):
        """The function this call runs: `replay` until a compiled one is verified and wins its trial."""
        chosen = self.chosen
        if chosen is not None:
            return chosen
        state = self.state
        if state == TRIAL:   # (alternating; `tiered` is set before the state, never unset)
            compiled_ns, replay_ns = self.trial_ns
            return self.tiered if len(compiled_ns) <= len(replay_ns) else replay
        if state == COMPILING:
            if time.perf_counter() - self.started > policy.tier_timeout_s:
                with self.lock:
                    if self.state == COMPILING:
                        self._settle(FAILED, f"timed out after {policy.tier_timeout_s:g} s, {_where()}", replay)
            return replay
        if state == REPLAY and not self.why:
            mode = policy.tier
            if mode == "eager" or (mode == "background" and steady):
                if self.segments is not None:
                    return tier_segments.capturing(self, replay, policy, background=mode == "background")
                self._start(replay, args, policy, background=mode == "background")
                if self.state == TRIAL:
                    return self.tiered
        return replay

    def settled(self, policy, hits: int) -> bool:
        """Whether nothing is left to decide under `policy` after `hits` replays: chosen, a replay that is not
        compiled, or (background) one that has not paid for a compile yet (the settled path hands the call at
        `due` back to the driver, replay.settled)."""
        if self.chosen is not None:
            return True
        if self.state != REPLAY:
            return False
        return bool(self.why) or policy.tier == "off" or (policy.tier == "background" and hits < self.due(policy))

    def due(self, policy) -> float:
        """The replay count at which the replay has paid for a background compile: `tier_after_replays`, and
        enough replays of its fastest timed call to add up to `tier_after_replayed_ms` (inf while none was
        timed, and for a replay that is not waiting for one)."""
        if policy.tier != "background" or self.state != REPLAY or self.why:
            return math.inf
        if policy.tier_after_replayed_ms <= 0:   # (no time to wait for: no timed call needed)
            return policy.tier_after_replays
        if not self.call_ns:
            return math.inf
        return max(policy.tier_after_replays, math.ceil(policy.tier_after_replayed_ms * 1e6 / self.call_ns))

    def timed(self, fn, ns: int, replay, policy) -> None:
        """Note a call's time: a replayed one before the trial for `due`; in the trial, after `tier_trial_calls`
        of each (past a warm-up call each), keep the faster."""
        if self.state != TRIAL or self.chosen is not None:
            if fn is replay and (ns < self.call_ns or not self.call_ns):
                self.call_ns = ns
            return
        compiled_ns, replay_ns = self.trial_ns
        (compiled_ns if fn is self.tiered else replay_ns).append(ns)
        if min(len(compiled_ns), len(replay_ns)) <= policy.tier_trial_calls:
            return
        fast, slow = min(compiled_ns[1:]), min(replay_ns[1:])
        timing = f"{fast / 1e6:.3f} ms a call against {slow / 1e6:.3f} ms replayed"
        with self.lock:
            if self.state != TRIAL:
                return
            if fast <= slow:
                self._settle(COMPILED, f"built in {self.compile_s:.1f} s; {timing}", self.tiered)
            else:
                self._settle(REPLAY, f"the compiled call was slower ({timing}; built in {self.compile_s:.1f} s)",
                             replay)

    # -- compiling ---------------------------------------------------------------------------------------------
    def _start(self, replay, args: list, policy, background: bool) -> None:
        with self.lock:
            if self.state != REPLAY or self.why:
                return
            if background:
                _ensure_worker()   # (its priority is part of the text)
            try:
                body = split_source(self.source, self.constants, args)
                inputs = _snapshot(args, policy.tier_max_copy_bytes)
                _carried_values(body, inputs)
                family, kind, self.sizes = tier_family.join(self.families, self.source, self.constants, args)
                generic = None if kind == tier_family.OWN else \
                    split_source(self.source, self.constants, args, rewrite=family.rewrite)
            except Untierable as e:
                self._settle(REPLAY, str(e), replay)
                return
            self.state, self.started, self.stats = COMPILING, time.perf_counter(), config.STATS.get() == "1"
            self._describe()
        sized, threads, timeout_s = (family, kind, generic), torch.get_num_threads(), policy.tier_timeout_s
        job = lambda: self._build(replay, body, inputs, sized, threads, timeout_s, background)   # noqa: E731
        if not background:
            job()   # (bounded: the compile process is stopped at the deadline)
        elif not _submit(job):
            with self.lock:
                self.state, self.started = REPLAY, 0.0   # the queue is full: asked again at a later call
                self._describe()

    def _build(self, replay, body, inputs: list, sized: tuple, threads: int, timeout_s: float, idle: bool) -> None:
        """Compile `body` in the compile process (replay.tier_process: the `idle` priority one for background
        compiles; stopped `timeout_s` after the compile was asked for), check it against `replay` on `inputs`, and
        move to the trial (or to failed, saying why); runs on the worker thread (background) or the caller's
        (eager). Never raises. The compile time noted includes starting the compile process (once per process:
        seconds). `sized`: (family, what its build does, the body with sizes as expressions) from
        replay.tier_family: the family's graph shared or built with dynamic sizes first, where that fails the
        body's own graph."""
        if self.state != COMPILING:   # (timed out while queued)
            return
        _use_our_cache()   # (the compile process and this one load from the same folder)
        t0, deadline = time.perf_counter(), self.started + timeout_s
        apart = dict(threads=threads, deadline=deadline, idle=idle)
        try:
            tiered, problem = self._family_build(replay, inputs, *sized, apart)
            if tiered is None:
                tiered, problem = _compiled_checked(replay, body, inputs, apart)
        except Exception as e:   # (whatever the compiler raises: the replay stays)
            tiered, problem = None, _failure(e, timeout_s)
        self._built(replay, tiered, problem, t0)

    def _family_build(self, replay, inputs: list, family, kind: str, generic, apart: dict) -> tuple:
        """(the tiered function through the family's graph, None) where it is shared or built with dynamic sizes
        (in the compile process: `apart`, `_graph`'s) and agrees with the replay; else (None, None), `sizes` saying
        why. A compile past the deadline raises tier_process.TimedOut (no time is left for the body's own)."""
        if kind == tier_family.OWN:
            return None, None
        try:
            if kind == tier_family.SHARE:
                graph = family.shared
            else:
                dynamic = family.dynamic_dims()
                graph = _graph(generic, inputs, dynamic={generic[2].index(a): d for a, d in dynamic.items()},
                               **apart)
            tiered, problem = _checked(replay, _tiered_of(generic, graph, inputs), inputs)
        except tier_process.TimedOut as e:
            family.failed = f"the graph with dynamic sizes was not kept (timed out: {e})"
            raise
        except Exception as e:   # (the compiler's errors, a graph whose assumptions these sizes are outside)
            tiered, problem = None, f"{type(e).__name__}: {_first_line(e)}"
        shared = len(family.members)
        if problem is None:
            if kind == tier_family.GENERIC:
                family.shared = graph
            self.sizes = (f"one graph with dynamic sizes for {shared} sizes" if kind == tier_family.GENERIC else
                          f"shares its family's graph of dynamic sizes ({shared} sizes)")
            return tiered, None
        if kind == tier_family.GENERIC:
            family.failed = f"the graph with dynamic sizes was not kept ({problem})"
        self.sizes = f"size-specialised: the family's graph of dynamic sizes was not kept ({problem})"
        return None, None

    def _built(self, replay, tiered, problem: str | None, t0: float) -> None:
        """A build begun at `t0` ended: on to the trial with `tiered`, or failed with `problem`."""
        with self.lock:
            if self.state != COMPILING:   # (timed out meanwhile)
                return
            self.compile_s = time.perf_counter() - t0
            if problem is not None:
                self._settle(FAILED, problem, replay)
            else:
                self.tiered, self.trial_ns = tiered, ([], [])
                self.state = TRIAL
                self._describe()

    def _settle(self, state: str, why: str, decided) -> None:
        self.state, self.why = state, why
        self._describe()
        self.chosen = decided

    def _describe(self) -> None:
        """`text`: the tier as PYPTO_STATS shows it (printed on a change made where PYPTO_STATS=1 was asked)."""
        if self.state == COMPILING:
            text = f"tier compiling ({_where()})"
        elif self.state == TRIAL:
            text = f"tier trial (compiled in {self.compile_s:.1f} s, timed against the replay)"
        elif self.state == REPLAY and not self.why:
            policy = current_policy()
            when = {"off": "not compiled", "eager": "compiled at the next replay"}.get(
                policy.tier, f"compiled in the background once it has paid for a compile: after "
                             f"{policy.tier_after_replays} replays and {policy.tier_after_replayed_ms / 1e3:g} s "
                             "replayed")
            text = f"tier replay (PYPTO_TIER={policy.tier}: {when})"
        else:
            text = f"tier {self.state} ({self.why})" if self.why else f"tier {self.state}"
        if self.segments is not None and self.segments.why_not is None:
            text = f"{text} · {self.segments.describe()}"
        if self.sizes:
            text = f"{text} · {self.sizes}"
        self.text = text
        if self.stats:
            print(f"pypto-rt stats [{self.entry}]: {text}", file=sys.stderr)


# -- compiling and checking ------------------------------------------------------------------------------------
def _checked(replay, tiered, inputs: list) -> tuple:
    """(`tiered`, or its wrapped call where the direct one disagrees (replay.tier_graph), why it does not give
    what `replay` gives, or None)."""
    problem = _mismatch(replay, tiered, inputs)
    if problem is not None and getattr(tiered, "wrapped", None) is not None:
        tiered = tiered.wrapped
        problem = _mismatch(replay, tiered, inputs)
    return tiered, problem


def _compiled_checked(replay, split, inputs: list, apart: dict) -> tuple:
    """(the tiered function of `split`'s own compiled graph, why it disagrees with `replay` or None); compiled
    again without joining K steps where the joined ones summed past the tolerance. `apart`: `_graph`'s threads,
    deadline and priority."""
    tiered, problem = _checked(replay, _compile(split, inputs, **apart), inputs)
    if problem is not None and getattr(tiered, "joined", 0):
        tiered, problem = _checked(replay, _compile(split, inputs, join=False, **apart), inputs)
    return tiered, problem


# the passes run on the traced graph before inductor (`module:function`, in the compile process): K steps joined,
# narrow products unrolled (replay.tier_passes.rewrite)
JOIN_PASSES = "pypto_rt.replay.tier:_joined"


def _joined(graph) -> int:
    return rewrite(graph, join=True)


def _unjoined(graph) -> int:
    return rewrite(graph, join=False, reorder=False)


def _failure(e: Exception, timeout_s: float) -> str:
    """Why a build ended in `e`, as the tier says it."""
    if isinstance(e, tier_process.TimedOut):
        return f"timed out after {timeout_s:g} s: the compile process was stopped ({e})"
    if isinstance(e, tier_process.CompileFailed):
        return f"the torch compiler failed: {e}"
    return f"the torch compiler failed: {type(e).__name__}: {_first_line(e)}"


def _compile(split, inputs: list, threads: int, join: bool = True, deadline: float = math.inf, idle: bool = False):
    """The tiered function: the prologue, then the compiled body on the tensor arguments, the replay's tensor
    constants and the values carried from the prologue, its outputs that are arguments given back as the caller's
    own tensors; built in the compile process (of `idle` priority) before `deadline` (replay.tier_process). It
    calls inductor's code directly where the graph allows (replay.tier_graph); then its `wrapped` is the same
    through compile_fx's wrappers (else None). `join`: K steps of a matmul joined before compiling
    (replay.tier_passes); `joined` says how many were."""
    return _tiered_of(split, _graph(split, inputs, threads, join=join, deadline=deadline, idle=idle), inputs)


def _graph(split, inputs: list, threads: int, dynamic: dict | None = None, join: bool = True,
           deadline: float = math.inf, idle: bool = False) -> tuple:
    """(compile_fx's function, inductor's direct call or None, the check of its assumptions or None, K steps
    joined): `split`'s body compiled on the call of `inputs`, in the compile process (of `idle` priority) before
    `deadline`; `dynamic`: tensor argument (its index among them) -> its dims compiled as symbolic sizes
    (replay.tier_family)."""
    body, positions = split[1], split[2]
    names, constants = tensor_constants(body)
    examples = [t for t in _copy(inputs) if t is not None] + _copy(constants)
    values = _carried_values(split, inputs)
    # (with carried values, tensors the replay keeps as constants enter the symbolic trace as graph inputs)
    return tier_process.compile_apart(
        body, (names, len(positions)) if names else None, examples, values, threads,
        (JOIN_PASSES if join else "pypto_rt.replay.tier:_unjoined", ()), deadline, idle, dynamic)


def _tiered_of(split, graph: tuple, inputs: list):
    """The tiered function of `split` calling `graph` (`_graph`'s). Assumptions only on sizes (no value carried)
    are checked once, on the call of `inputs` (a specialisation's sizes are fixed): Untierable where they fail."""
    compiled, direct, guards, joined = graph
    _, constants = tensor_constants(split[1])
    if guards is not None and not split[4]:
        at = [*[inputs[i] for i in split[2]], *constants]
        if not guards(at):
            raise Untierable("its sizes are outside what the graph of dynamic sizes assumed")
        guards = None
    wrapped = _tiered(split, lambda graph_inputs: compiled(*graph_inputs), constants, guards)
    wrapped.joined = joined
    if direct is None:
        return wrapped
    tiered = _tiered(split, direct, constants, guards)
    tiered.wrapped, tiered.joined = wrapped, joined
    return tiered


def _tiered(split, call, constants: list, guards):
    """The tiered function calling the compiled graph by `call(list of graph inputs)`; `outside` counts the calls
    whose carried values the graph's assumptions did not hold for (the body replayed)."""
    prologue, positions, outputs_from = split[0], split[2], split[3]
    returns = tuple(enumerate(outputs_from))
    replay = _body_replay(split)

    def tiered(*args):
        scalars = prologue(*args) if prologue is not None else ()
        if scalars is GUARD_MISS:
            return GUARD_MISS
        graph_inputs = [*[args[i] for i in positions], *constants, *scalars]
        if guards is not None and not guards(graph_inputs):
            tiered.outside += 1   # (values the graph was not built for: the body replayed)
            return replay(args, scalars)
        outs = call(graph_inputs)
        return tuple(outs[k] if p < 0 else args[p] for k, p in returns)
    tiered.outside, tiered.wrapped = 0, None
    return tiered


def _body_replay(split):
    """`(args, carried values) -> results`: the body run as replayed torch calls."""
    body, positions, outputs_from = split[1], split[2], split[3]
    returns = tuple(enumerate(outputs_from))

    def replay(args, scalars):
        outs = body(*[args[i] for i in positions], *scalars)
        return tuple(outs[k] if p < 0 else args[p] for k, p in returns)
    return replay


def _carried_values(split, inputs: list) -> tuple:
    """The values the prologue carries into the body on the call of `inputs`: ints, else Untierable."""
    prologue, carried = split[0], split[4]
    if not carried:
        return ()
    values = prologue(*inputs)   # (it only reads)
    if values is GUARD_MISS:
        raise Untierable("its guards did not pass on the call it was to be built from")
    for name, value in zip(carried, values):
        if type(value) is not int:
            raise Untierable(f"its torch calls take a {type(value).__name__} read from data ({name}) as an "
                             "operand: kept as a replay (only integers go to the compiled graph)")
    return values


# `() -> folder or None`: where inductor's caches go, set by the layer that owns the disk cache
# (orchestration.program_cache: `<PYPTO_CACHE_DIR>/inductor`); replay does not import the disk cache itself
cache_folder = None


def _use_our_cache() -> None:
    """Inductor's caches under the disk cache's folder, unless the user (or inductor, already loaded) chose a
    folder; kept for the process (inductor reads the variable per compile)."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ and cache_folder is not None:
        where = cache_folder()
        if where is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = where


def _mismatch(replay, tiered, inputs: list) -> str | None:
    """Why `tiered` does not give what `replay` gives on copies of `inputs` (results and every argument's memory
    afterwards), or None when it does."""
    want_args, got_args = _copy(inputs), _copy(inputs)
    want, got = replay(*want_args), tiered(*got_args)
    if want is GUARD_MISS or got is GUARD_MISS:
        return "the compiled function's guards did not pass on the call it was built from"
    pairs = [(f"result {i}", w, g) for i, (w, g) in enumerate(zip(want, got))] + [
        (f"argument {i}", w, g) for i, (w, g) in enumerate(zip(want_args, got_args)) if w is not None]
    for what, w, g in pairs:
        problem = _differs(w, g)
        if problem:
            return f"the compiled {what} differs from the replay's: {problem}"
    return None


_COMPARED = 1 << 20   # elements compared at a time: the comparison's temporaries (several per element) stay a few
                     # MiB, where whole 128 MiB receive buffers on 8 ranks checking at once ran a 24 GiB host out


def _differs(want: torch.Tensor, got: torch.Tensor) -> str | None:
    if want.shape != got.shape or want.dtype != got.dtype:
        return f"{tuple(got.shape)} {got.dtype} instead of {tuple(want.shape)} {want.dtype}"
    want_flat, got_flat = want.reshape(-1), got.reshape(-1)
    for start in range(0, want_flat.numel(), _COMPARED):
        w, g = want_flat[start : start + _COMPARED], got_flat[start : start + _COMPARED]
        if want.is_floating_point() or want.is_complex():
            try:
                torch.testing.assert_close(g, w, equal_nan=True)
            except AssertionError as e:
                return " ".join(line.strip() for line in str(e).splitlines()[1:3]) + \
                    f" (elements {start}..{start + w.numel() - 1} of {want.numel()}, flattened)"
        elif not torch.equal(g, w):
            return f"{int((got != want).sum())} of {want.numel()} elements differ ({want.dtype}: compared bit for bit)"
    return None


def _first_line(e: Exception) -> str:
    """The first line of `e`'s message, and the first line naming an error after it (a C++ compiler's)."""
    text = str(e).strip().splitlines()
    if not text:
        return ""
    detail = next((line.split("error:", 1)[1].strip() for line in text[1:] if "error:" in line), "")
    return (text[0] + (f" ({detail})" if detail else ""))[:400]


def tiers(kernel) -> list[Tier]:
    """The tiers of entry `kernel`'s specialisations that recorded a replay, in the order first seen (a program's
    bound method: its kernel's)."""
    kernel = getattr(kernel, "kernel", kernel)
    return [spec.tier for spec in kernel.state.replay.values() if spec.tier is not None]
