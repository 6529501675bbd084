"""The compiled tier (replay.tier, PYPTO_TIER): a steady replay compiled by inductor and swapped in.

What users depend on: a compiled call gives the replay's results (in-place writes land in the caller's tensors,
returned arguments are the caller's own); calls made while the compiled function is swapped in are right; values
read from data are read again and their guards still send a call taking another course to the engine; a compile
that fails, disagrees or times out leaves the replay, saying why in PYPTO_STATS; a fresh process gets the
compiled code from inductor's cache on disk. Compiles take seconds here: two kernels are compiled in the module.
"""
from __future__ import annotations

import contextvars
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

import pypto.language as pl
from pypto_rt import config, run_stats
from pypto_rt.errors import InWriteWarning
from pypto_rt.replay import entry as replay
from pypto_rt.replay import tier as tier_module
from pypto_rt.replay import tier_inductor, tier_process, tier_worker
from pypto_rt.replay.policy import policy_scope
from pypto_rt.replay.tier import COMPILED, COMPILING, FAILED, REPLAY, TRIAL, tiers
from pypto_rt.replay.tier_source import split_source
from pypto_rt.run_stats import GUARD_MISS, REPLAYED

ROWS, COLS = 8, 16
WARM = 8   # calls that reach a steady replay: engine runs, the recording, the engine trial
# keep the replay (no engine trial); keep trying both tiers (the tier trial never ends)
KEEP = dict(slower=float("inf"), trial_replays=0, tier_trial_calls=1 << 30, tier_after_replays=0,
            tier_after_replayed_ms=0)


def scale_into_source():
    @pl.jit
    def scale_into(x: pl.Tensor[[ROWS, COLS], pl.FP32], acc: pl.InOut[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
            acc[:, :] = pl.add(pl.mul(acc[:, :], 0.5), pl.exp(x[:, :]))
        return acc
    return scale_into


def want_scale_into(x, acc):
    return acc * 0.5 + torch.exp(x)


@pl.jit
def by_flag(x: pl.Tensor[[ROWS, COLS], pl.FP32], flag: pl.Tensor[[1], pl.INT32],
            y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    on = pl.read(flag, [0])   # read again by each call; the branch taken is a guard
    if on > 0:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="up"):
            y[:, :] = pl.add(pl.mul(x, 3.0), 1.0)
    else:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="down"):
            y[:, :] = pl.sub(x, 1.0)
    return y


def gather_row_source():
    @pl.jit
    def gather_row(src: pl.Tensor[[ROWS, COLS], pl.FP32], index: pl.Tensor[[1], pl.INT32],
                   out: pl.Out[pl.Tensor[[1, COLS], pl.FP32]]):
        row = pl.read(index, [0])   # an offset read from data: the body depends on it
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy_row"):
            out[0:1, :] = pl.mul(src[row : row + 1, :], 2.0)
        return out
    return gather_row


def in_context(fn):
    """`fn` run in a copy of this context (threads do not inherit policy scopes or knob overrides)."""
    context = contextvars.copy_context()
    return lambda *args: context.run(fn, *args)


@pytest.fixture(scope="module")
def flag_compiled():
    """`by_flag` with its flag-on specialisation compiled (eager: at its first replay) and in its trial."""
    with config.scope(TIER="eager"), policy_scope(**KEEP):
        x = torch.randn(ROWS, COLS)
        for _ in range(WARM):
            by_flag(x, torch.tensor([1], dtype=torch.int32), torch.empty(ROWS, COLS))
    (found,) = tiers(by_flag)
    assert found.state == TRIAL and found.tiered is not None, found.text
    return found


@pytest.fixture
def background_at_normal_priority(monkeypatch):
    """Background compiles in a compile process at normal priority: at nice 19 on a shared machine under other
    jobs' load one waited minutes for CPU (what idle priority is for; not what these tests check)."""
    def restart():
        slot = tier_process._slots[True]
        with slot.lock:
            tier_process._stop(slot)
    monkeypatch.setattr(tier_process, "IDLE_NICE", 0)
    restart()
    yield
    restart()


@pytest.mark.timeout(480)
def test_calls_during_the_swap_from_several_threads_are_right(background_at_normal_priority):
    scale_into = scale_into_source()
    errors, seen = [], set()
    done = threading.Event()

    def caller(seed):
        g = torch.Generator().manual_seed(seed)
        while not done.is_set():
            x, acc = torch.randn(ROWS, COLS, generator=g), torch.randn(ROWS, COLS, generator=g)
            want = want_scale_into(x, acc)
            out = scale_into(x, acc)
            if out is not acc or not torch.allclose(acc, want, rtol=1e-5, atol=1e-6):
                errors.append(f"thread {seed}: wrong result or not the caller's tensor")
            for t in tiers(scale_into):
                seen.add(t.state)
            time.sleep(0.002)   # (let the compiling thread have the interpreter too)

    with config.scope(TIER="background"), policy_scope(**KEEP):
        threads = [threading.Thread(target=in_context(caller), args=(s,)) for s in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 400   # (the compile process starts: seconds, tens on a loaded machine)
        while time.monotonic() < deadline and not any(t.state == TRIAL for t in tiers(scale_into)):
            time.sleep(0.05)
        time.sleep(0.3)   # calls alternate compiled and replayed under the threads
        done.set()
        for t in threads:
            t.join(30)
    (found,) = tiers(scale_into)
    assert found.state == TRIAL, found.text
    assert not errors, errors[:3]
    assert COMPILING in seen and TRIAL in seen, seen   # calls went on while it compiled, then with it swapped in
    assert len(found.trial_ns[0]) > 2, "the compiled function was hardly called"


def test_an_inout_argument_is_written_in_place_and_returned_as_itself(flag_compiled):
    scale_into = scale_into_source()
    with config.scope(TIER="eager"), policy_scope(**KEEP):
        for i in range(WARM + 3):
            x, acc = torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)
            want = want_scale_into(x, acc)
            view = acc[2:4]
            out = scale_into(x, acc)
            assert out is acc and torch.allclose(acc, want, rtol=1e-5, atol=1e-6), f"call {i}"
            assert torch.equal(view, acc[2:4]), "the result did not land in the caller's memory"
    (found,) = tiers(scale_into)
    assert found.state == TRIAL and found.trial_ns[0], found.text   # compiled calls ran among those
    (decision,) = replay.decisions(scale_into)   # what PYPTO_STATS prints with the replay's line
    assert decision.kind == REPLAYED and "tier trial (compiled in " in decision.reason, decision


def test_a_guard_miss_after_the_swap_runs_the_engine_and_reads_the_flag_again(flag_compiled, monkeypatch):
    monkeypatch.setattr(flag_compiled, "chosen", flag_compiled.tiered)   # swapped in: every call runs it
    x = torch.randn(ROWS, COLS)
    with config.scope(TIER="eager"), policy_scope(**KEEP):
        for on in (1, 1, 0, 1, 0):
            y = torch.empty(ROWS, COLS)
            with run_stats.collect() as stats:
                by_flag(x, torch.tensor([on], dtype=torch.int32), y)
            want = x * 3.0 + 1.0 if on else x - 1.0
            assert torch.allclose(y, want, rtol=1e-6, atol=1e-6), f"flag {on}"
            assert stats.replay.kind == (REPLAYED if on else GUARD_MISS), stats.replay


def test_values_read_from_data_as_offsets_go_to_the_graph_as_integers(monkeypatch):
    gather_row = gather_row_source()
    src = torch.randn(ROWS, COLS)
    with config.scope(TIER="eager"), policy_scope(**KEEP):
        for i in range(WARM + ROWS):
            row = (3 * i + 1) % ROWS   # (built on row 1; then every row, 0 and the last included)
            out = torch.empty(1, COLS)
            gather_row(src, torch.tensor([row], dtype=torch.int32), out)
            assert torch.equal(out, src[row : row + 1] * 2.0), f"call {i} read row {row}"
            if i == WARM - 1:   # compiled: from now on every call runs the compiled function
                (found,) = tiers(gather_row)
                assert found.state == TRIAL and found.tiered is not None, found.text
                monkeypatch.setattr(found, "chosen", found.tiered)
    assert found.tiered.outside < ROWS, "the compiled graph was built for the traced row only"


def test_a_carried_value_outside_what_the_graph_assumed_replays_the_body(monkeypatch):
    def assumed_not_row_5(code, inputs):   # (as if tracing had assumed row != 5; read where the code is loaded)
        return lambda graph_inputs: graph_inputs[-2] != 5
    monkeypatch.setattr(tier_inductor, "assumptions", assumed_not_row_5)
    gather_row = gather_row_source()
    src = torch.randn(ROWS, COLS)
    with config.scope(TIER="eager"), policy_scope(**KEEP):
        for _ in range(WARM):
            gather_row(src, torch.tensor([2], dtype=torch.int32), torch.empty(1, COLS))
        (found,) = tiers(gather_row)
        monkeypatch.setattr(found, "chosen", found.tiered)
        for row, outside in ((5, 1), (3, 1), (5, 2)):
            out = torch.empty(1, COLS)
            gather_row(src, torch.tensor([row], dtype=torch.int32), out)
            assert torch.equal(out, src[row : row + 1] * 2.0), f"row {row}"
            assert found.tiered.outside == outside, f"row {row}: {found.tiered.outside} calls replayed"


@pl.jit
def scale_by(x: pl.Tensor[[ROWS, COLS], pl.FP32], scale: pl.Tensor[[1], pl.FP32],
             y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    s = pl.read(scale, [0])   # a float operand read from data
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale_by"):
        y[:, :] = pl.mul(x, s)
    return y


def test_a_float_read_from_data_as_an_operand_keeps_the_replay_and_says_why():
    x = torch.randn(ROWS, COLS)
    with config.scope(TIER="eager"), policy_scope(**KEEP):
        for i in range(WARM):
            y = torch.empty(ROWS, COLS)
            scale_by(x, torch.tensor([0.5 + i], dtype=torch.float32), y)
            assert torch.allclose(y, x * (0.5 + i)), f"call {i}"
    (found,) = tiers(scale_by)
    assert found.state == REPLAY and "float read from data" in found.why and found.tiered is None, found.text


def test_the_prologue_is_the_reads_of_data_and_the_numbers_computed_from_them():
    def split(lines: str):
        source = "def replay(a0, a1, a2):\n" + "".join(f"    {line}\n" for line in lines.strip().splitlines())
        constants = {"f0": torch.as_strided, "mul_1": torch.mul, "t_0": torch.t}
        prologue, body, positions, outputs_from, carried = split_source(source, constants, [1, 2, 3])
        return prologue, carried
    # leading slices of entry tensors are the body's: nothing is read from data
    assert split("v3 = a0[0:4, :]\nv4 = v3[:, 0:2]\nv5 = t_0(v4)\na2[0:2, 0:4] = v5\nreturn (a2,)") == (None, [])
    # reads without a guard (and a view of a large tensor read by element) are the prologue's all the same
    prologue, carried = split("r0 = f0(a1, (1,), (1,), 0).tolist()\ns0 = r0[0]\nr1 = f0(a2, (4096,), (1,), 0)\n"
                              "s1 = r1[7].item()\nc0 = s0 + s1\nv2 = mul_1(a0, c0)\nreturn (v2,)")
    assert prologue is not None and carried == ["c0"]


def _warm_fresh(tier_mode, **policy):
    """A fresh `scale_into`, called into its steady replay with `tier_mode`; its tier."""
    scale_into = scale_into_source()
    with config.scope(TIER=tier_mode), policy_scope(**KEEP, **policy):
        for i in range(WARM):
            x, acc = torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)
            want = want_scale_into(x, acc)
            scale_into(x, acc)
            assert torch.allclose(acc, want, rtol=1e-5, atol=1e-6), f"call {i}"
    (found,) = tiers(scale_into)
    return found


def test_a_failing_compile_keeps_the_replay_and_stats_say_why(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("injected: the C++ compiler is missing")
    monkeypatch.setattr(tier_module, "_compile", broken)
    with config.scope(STATS="1"):
        found = _warm_fresh("eager")
    assert found.state == FAILED and "injected" in found.why and found.chosen is not None, found.text
    assert "tier failed (the torch compiler failed: RuntimeError: injected" in capsys.readouterr().err


def test_a_compiled_function_that_disagrees_with_the_replay_is_not_swapped_in(monkeypatch):
    def wrong(split, inputs, threads, **kwargs):
        prologue, body, positions, outputs_from, carried = split

        def off_by_one(*args):
            outs = body(*[args[i] for i in positions])
            args[positions[-1]].add_(1.0)
            return outs
        return off_by_one
    monkeypatch.setattr(tier_module, "_compile", wrong)
    found = _warm_fresh("eager")
    assert found.state == FAILED and "differs from the replay" in found.why, found.text


def test_the_compiled_graph_is_called_without_compile_fx_wrappers(flag_compiled):
    """Where AOT kept the traced graph's inputs and outputs, the tier calls inductor's code itself (replay.tier_graph:
    ~9 µs a call less); the wrapped call is kept beside it and gives the same."""
    assert flag_compiled.tiered.wrapped is not None
    x = torch.randn(ROWS, COLS)
    direct, wrapped = torch.empty(ROWS, COLS), torch.empty(ROWS, COLS)
    flag_compiled.tiered(x, torch.tensor([1], dtype=torch.int32), direct)
    flag_compiled.tiered.wrapped(x, torch.tensor([1], dtype=torch.int32), wrapped)
    assert torch.equal(direct, wrapped) and torch.allclose(direct, x * 3.0 + 1.0)


def test_a_direct_graph_call_that_disagrees_falls_back_to_the_wrapped_call(monkeypatch):
    def forgetful(module, threads, changes):   # (the compile process's module, loaded here)
        return lambda inputs: tuple(inputs)   # (writes nothing: as if a wrapper's copy-back were needed)
    monkeypatch.setattr(tier_inductor, "load", forgetful)
    found = _warm_fresh("eager")
    assert found.state == TRIAL and found.tiered.wrapped is None, found.text


def test_a_graph_whose_joined_k_steps_disagree_is_compiled_again_without_joining(monkeypatch):
    monkeypatch.setattr(tier_module, "JOIN_PASSES", "tests.replay.tier_hooks:spoiling")   # (run by the child)
    found = _warm_fresh("eager")
    assert found.state == TRIAL and found.tiered.joined == 0, found.text


def test_a_compile_past_the_timeout_keeps_the_replay(monkeypatch):
    monkeypatch.setattr(tier_module, "JOIN_PASSES", "tests.replay.tier_hooks:stall")   # (a compile that never ends)
    # steady after one replay: queued at the next call, timed out at the one after
    found = _warm_fresh("background", tier_timeout_s=0.0)
    assert tier_worker.wait_idle(60)
    assert found.state == FAILED and "timed out" in found.why, found.text


@pytest.mark.timeout(120)
def test_an_eager_compile_past_the_timeout_keeps_the_replay_without_holding_the_call(monkeypatch):
    """Eager compiles on the caller's behalf, but waits for it at most `tier_timeout_s`: a compile running longer (a
    replay of thousands of torch calls takes inductor minutes) keeps the replay, and the call goes on replayed."""
    monkeypatch.setattr(tier_module, "JOIN_PASSES", "tests.replay.tier_hooks:stall")   # (a compile that never ends)
    start = time.monotonic()
    found = _warm_fresh("eager", tier_timeout_s=0.5)
    seconds = time.monotonic() - start
    assert seconds < 20, seconds   # (not the hour the compile would have held the call)
    assert found.state == FAILED and found.why.startswith("timed out after 0.5 s: the compile process was stopped"), \
        found.text
    assert found.chosen is not None


@pytest.mark.timeout(600)
def test_a_compile_past_the_timeout_kills_its_process_and_the_next_compile_gets_a_fresh_one(monkeypatch):
    """Before: a compile past `tier_timeout_s` ran on (a thread cannot be stopped), holding the worker, its CPU and
    the compiles queued behind it. Now the compile process is killed at the deadline, with the C++ compilers it
    started, and the next compile starts a fresh one."""
    assert _warm_fresh("eager").state == TRIAL   # (the eager compile process runs)
    old = tier_process._slots[False].child
    assert old is not None and old.process.poll() is None
    monkeypatch.setattr(tier_module, "JOIN_PASSES", "tests.replay.tier_hooks:stall")
    found = _warm_fresh("eager", tier_timeout_s=5.0)
    assert found.state == FAILED and found.why.startswith("timed out after 5 s"), found.text
    assert old.process.poll() is not None and tier_process._slots[False].child is None   # killed, and reaped
    with pytest.raises(ProcessLookupError):
        os.killpg(old.process.pid, 0)   # (its process group, what it started included, is gone)
    monkeypatch.undo()
    found = _warm_fresh("eager")
    fresh = tier_process._slots[False].child
    assert found.state == TRIAL, found.text
    assert fresh is not None and fresh is not old and fresh.process.pid != old.process.pid


def test_off_never_compiles():
    found = _warm_fresh("off")
    assert found.state == REPLAY and found.tiered is None and not found.why, found.text


FRESH = r"""
import sys, torch
sys.path.insert(0, {repo!r})
from pypto_rt import config
from pypto_rt.replay import tier_process
from pypto_rt.replay.policy import policy_scope
from pypto_rt.replay.tier import tiers
from tests.replay.test_tier import by_flag, KEEP, WARM, ROWS, COLS
x = torch.randn(ROWS, COLS)
with config.scope(TIER="eager"), policy_scope(**KEEP):
    for _ in range(WARM):
        by_flag(x, torch.tensor([1], dtype=torch.int32), torch.empty(ROWS, COLS))
(found,) = tiers(by_flag)
print("STATE", found.state, "HITS", tier_process.cache[0], "MISSES", tier_process.cache[1])
"""


@pytest.mark.timeout(400)
def test_a_fresh_process_loads_the_compiled_code_from_disk(flag_compiled):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYPTO_TIER="off")   # (the script asks for eager itself)
    assert env.get("TORCHINDUCTOR_CACHE_DIR"), "the compile in this process set inductor's cache folder"
    done = subprocess.run([sys.executable, "-c", FRESH.format(repo=repo)], capture_output=True, text=True,
                          timeout=360, env=env, cwd=repo)   # (it starts its compile process: tens of s, loaded)
    assert done.returncode == 0, done.stderr[-2000:]
    words = done.stdout.split()
    state, hits, misses = (words[words.index(w) + 1] for w in ("STATE", "HITS", "MISSES"))
    assert state == TRIAL and int(hits) >= 1 and int(misses) == 0, done.stdout


def test_arguments_sharing_memory_are_compiled_for_that_sharing():
    scale_into = scale_into_source()
    with config.scope(TIER="eager"), policy_scope(**KEEP), warnings.catch_warnings():
        warnings.simplefilter("ignore", InWriteWarning)   # (x shares acc's memory: the kernel says so)
        for i in range(WARM + 3):
            whole = torch.randn(2 * ROWS, COLS)
            x, acc = whole[:ROWS], whole[ROWS:]
            want = want_scale_into(x.clone(), acc.clone())
            scale_into(x, acc)
            assert torch.allclose(acc, want, rtol=1e-5, atol=1e-6) and torch.equal(whole[ROWS:], acc), f"call {i}"
    (found,) = tiers(scale_into)
    assert found.state == TRIAL and found.trial_ns[0], found.text


def test_a_forked_child_of_a_process_whose_worker_ran_gets_its_own_worker():
    """A process that compiled in the background forks (multiprocessing, a launcher's ranks): the child's background
    jobs run on a worker of its own (fork copies only the calling thread; before, the child queued its jobs for the
    parent's worker, which it does not have, and waited on them for ever)."""
    import multiprocessing

    assert tier_worker.submit(lambda: None) and tier_worker.wait_idle(30)   # the parent's worker runs
    ran = multiprocessing.get_context("fork").Queue()

    def child():
        tier_worker.submit(lambda: ran.put(os.getpid()))
        ran.put("idle" if tier_worker.wait_idle(20) else "stuck")

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    try:
        got = [ran.get(timeout=30), ran.get(timeout=30)]
    finally:
        proc.join(30)
    assert got == [proc.pid, "idle"], got


def _pipes() -> set:
    """The pipes (inode numbers) this process holds open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            found.add(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists open files through /proc")
def test_a_forked_process_does_not_hold_the_compile_process_pipes(flag_compiled):
    """A host-form rank forks from a process whose compile process runs: the fork closes its copies of the pipes
    (else the compile process's input stays open while any fork lives) and starts its own compile process."""
    import multiprocessing

    child = tier_process._slots[False].child   # (flag_compiled started it)
    ours = {f"pipe:[{os.fstat(c.fileno()).st_ino}]" for c in (child.requests, child.replies)}
    assert ours <= _pipes()
    seen = multiprocessing.get_context("fork").Queue()

    def forked():
        seen.put((sorted(ours & _pipes()), tier_process._slots[False].child is None))

    proc = multiprocessing.get_context("fork").Process(target=forked)
    proc.start()
    try:
        got = seen.get(timeout=60)
    finally:
        proc.join(30)
    assert got == ([], True), got
    assert proc.exitcode == 0 and child.process.poll() is None   # (the fork's exit left the compile process alone)


def test_by_default_a_short_run_never_compiles_and_its_replay_takes_the_settled_path():
    """PYPTO_TIER=background is the default: a kernel called a few hundred times (a CLI run, the demo) has not paid
    for a compile (`tier_after_replays` replays and `tier_after_replayed_ms` replayed), so nothing compiles and the
    replay is served by the settled path meanwhile (before, a background replay waiting for its compile never
    settled: every call took the driver)."""
    scale_into = scale_into_source()
    with config.scope(TIER="background"):
        for _ in range(200):
            scale_into(torch.randn(ROWS, COLS), torch.randn(ROWS, COLS))
    (found,) = tiers(scale_into)
    assert found.state == REPLAY and not found.why and found.started == 0.0, found.text
    assert "once it has paid for a compile: after 500 replays and 2 s replayed" in found.text, found.text
    assert scale_into.state.settled is not None, "the waiting replay did not take the settled path"


def test_a_replay_that_has_paid_for_a_compile_is_compiled_in_the_background_from_the_settled_path(
        background_at_normal_priority):
    scale_into = scale_into_source()
    policy = dict(KEEP, tier_after_replays=40, tier_after_replayed_ms=0.0)
    with config.scope(TIER="background"), policy_scope(**policy) as in_force:
        for _ in range(39):
            scale_into(torch.randn(ROWS, COLS), torch.randn(ROWS, COLS))
        (found,) = tiers(scale_into)
        assert found.state == REPLAY and scale_into.state.settled is not None, found.text
        assert found.due(in_force) == 40
        for i in range(10):   # (36 replays so far: the 40th hands the next call to the driver, which compiles)
            x, acc = torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)
            want = want_scale_into(x, acc)
            scale_into(x, acc)
            assert torch.allclose(acc, want, rtol=1e-5, atol=1e-6), f"call {i}"
            if found.state != REPLAY:
                break
        assert found.state != REPLAY and i == 4, (i, found.text)
        assert tier_worker.wait_idle(300)
        scale_into(torch.randn(ROWS, COLS), torch.randn(ROWS, COLS))
    assert found.state == TRIAL, found.text
    # inductor compiled on the worker thread itself (compile_threads 1): no pool of compile processes or threads,
    # which would neither inherit the worker's priority nor end with the process
    from torch._inductor.async_compile import AsyncCompile
    assert AsyncCompile.process_pool.cache_info().currsize == AsyncCompile.pool.cache_info().currsize == 0


def test_the_replayed_time_a_compile_waits_for_is_counted_from_the_fastest_timed_replay():
    scale_into = scale_into_source()
    with config.scope(TIER="background"), policy_scope(**dict(KEEP, tier_after_replayed_ms=5.0)) as in_force:
        for _ in range(WARM):
            scale_into(torch.randn(ROWS, COLS), torch.randn(ROWS, COLS))
        (found,) = tiers(scale_into)
        assert found.call_ns > 0 and found.due(in_force) == -(-5_000_000 // found.call_ns), found.call_ns
    with config.scope(TIER="off"), policy_scope(**KEEP) as in_force:
        assert found.due(in_force) == float("inf")   # (nothing waits for a compile)


EXITING = r"""
import sys, time, torch
sys.path.insert(0, {repo!r})
from pypto_rt import config
from pypto_rt.replay import tier_process
from pypto_rt.replay.policy import policy_scope
from pypto_rt.replay.tier import COMPILING, tiers
from tests.replay.test_tier import scale_into_source, KEEP, ROWS, COLS
f = scale_into_source()
with config.scope(TIER="background"), policy_scope(**KEEP):
    for _ in range(40):
        f(torch.randn(ROWS, COLS), torch.randn(ROWS, COLS))
        if tiers(f) and tiers(f)[0].state == COMPILING:
            break
deadline = time.monotonic() + 120
while tier_process._slots[True].child is None and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(2)   # (well into the compile: loading inductor, tracing, compiling)
print("EXITING", tiers(f)[0].text, "CHILD", tier_process._slots[True].child.process.pid, "AT", time.monotonic(),
      flush=True)
"""
EXITING_EAGER = r"""
import sys, threading, time, torch
sys.path.insert(0, {repo!r})
from pypto_rt import config
from pypto_rt.replay import tier as tier_module, tier_process
from pypto_rt.replay.policy import policy_scope
from pypto_rt.replay.tier import tiers
from tests.replay.test_tier import in_context, scale_into_source, KEEP, WARM, ROWS, COLS
tier_module.JOIN_PASSES = "tests.replay.tier_hooks:stall"   # (the compile would take an hour)
f = scale_into_source()
def calls():
    for _ in range(WARM + 2):
        f(torch.randn(ROWS, COLS), torch.randn(ROWS, COLS))
with config.scope(TIER="eager"), policy_scope(**KEEP):
    caller = threading.Thread(target=in_context(calls))   # (a serving thread, waiting for it; not a daemon)
    caller.start()
deadline = time.monotonic() + 120
while (tier_process._slots[False].child is None or not tiers(f)) and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(2)
print("EXITING", tiers(f)[0].text, "CHILD", tier_process._slots[False].child.process.pid, "AT", time.monotonic(),
      flush=True)
"""


def _exits_promptly_and_quietly(script: str, text: str):
    """Run `script`, which exits while a compile runs: status 0, no traceback, soon, and its compile process gone."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", script.replace("{repo!r}", repr(repo))], capture_output=True,
                          text=True, timeout=300, cwd=repo, env=dict(os.environ, PYPTO_TIER="off"))   # (it asks itself)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert f"EXITING {text}" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr and "terminate called" not in done.stderr, done.stderr[-2000:]
    child, at = int(done.stdout.split("CHILD")[1].split()[0]), float(done.stdout.split("AT")[1].split()[0])
    assert time.monotonic() - at < 30, "the exit waited for the compile"
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)   # (killed at exit, not left compiling)


@pytest.mark.timeout(330)
def test_a_job_that_exits_while_a_background_compile_runs_exits_promptly_and_quietly():
    _exits_promptly_and_quietly(EXITING, "tier compiling (in the background, in a compile process at idle priority, "
                                         "nice 19)")


@pytest.mark.timeout(330)
def test_a_job_that_exits_while_a_thread_waits_for_an_eager_compile_exits_promptly_and_quietly():
    """Before: the eager compile ran on a daemon thread of its own, inside torch's C++ when the interpreter ended it
    (a possible abort, status 134); a non-daemon caller held the exit until the timeout (300 s). Now the compile
    process is killed when the main thread ends: the waiting call goes on replayed and the process exits."""
    _exits_promptly_and_quietly(EXITING_EAGER, "tier compiling (in a compile process at normal priority, the call "
                                               "waiting)")


def test_the_check_compares_large_tensors_piecewise_and_still_finds_one_wrong_element():
    # (8 ranks each checking a 128 MiB receive buffer at once: whole-tensor comparisons ran the host out of memory)
    from pypto_rt.replay import tier as tier_module
    size = 3 * tier_module._COMPARED + 5
    want = torch.zeros(size, 2)
    assert tier_module._differs(want, want.clone()) is None
    got = want.clone()
    got[size - 1, 1] = 1e-3
    problem = tier_module._differs(want, got)
    assert problem and f"of {2 * size}, flattened" in problem, problem
    ints = torch.arange(size)
    wrong = ints.clone()
    wrong[2] = -1
    problem = tier_module._differs(ints, wrong)
    assert problem.startswith(f"1 of {size} elements differ"), problem


def test_copies_a_build_holds_for_earlier_segments_count_against_the_copy_limit():
    # (a MoE dispatch's per-expert segments each copied the whole receive buffer: 8 ranks ran out of memory)
    from pypto_rt.replay.tier_copies import Held, snapshot
    from pypto_rt.replay.tier_source import Untierable
    mib = torch.zeros(1 << 18)   # 1 MiB
    held = Held()
    first = snapshot([mib, mib[:10]], 3 << 20, held)
    assert held.bytes == 1 << 20 and first[1].untyped_storage().data_ptr() == first[0].untyped_storage().data_ptr()
    snapshot([mib.clone()], 3 << 20, held)
    with pytest.raises(Untierable, match="with the 2 MiB the build's earlier segments hold"):
        snapshot([torch.zeros(1 << 19)], 3 << 20, held)
    assert held.bytes == 2 << 20


def test_a_tensor_no_one_wrote_since_an_earlier_segment_copied_it_shares_that_copy():
    # (an 8-rank skewed MoE combine: each live-sums segment copied the same 64 MiB of expert rows, and the copy
    # limit left three of them replayed)
    from pypto_rt.replay.tier_copies import Held, snapshot
    rows, sums, window = torch.ones(1 << 18), torch.zeros(1 << 10), torch.zeros(1 << 10)
    held = Held()
    first = snapshot([rows, sums, window], 4 << 20, held, shared=[True, True, False])
    sums.add_(1)   # (the segment wrote it: the next copies it again)
    second = snapshot([rows, sums, window], 4 << 20, held, shared=[True, True, False])
    assert held.bytes == (1 << 20) + 4 * (4 << 10)   # the rows once; the sums and the window twice each
    assert second[0].untyped_storage().data_ptr() == first[0].untyped_storage().data_ptr()
    assert second[1].untyped_storage().data_ptr() != first[1].untyped_storage().data_ptr()
    assert torch.equal(first[1], torch.zeros(1 << 10)) and torch.equal(second[1], torch.ones(1 << 10))
    assert second[2].untyped_storage().data_ptr() != first[2].untyped_storage().data_ptr()   # (peers write it)
    assert snapshot([rows.clone()], 4 << 20, held)[0].untyped_storage().data_ptr() != \
        first[0].untyped_storage().data_ptr()   # (another tensor, though equal)
