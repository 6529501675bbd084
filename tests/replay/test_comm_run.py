"""A run of communication lines called as one (replay.comm_run): what a compiled tier's Python parts come to.

What users depend on: every call writes what the recorded lines write (rows, count rows, signals), with row counts
and values changing call to call, whether the run goes fast or as recorded; a count past the room, other tensors, a
closed window or a wait whose cell is not there yet run the recorded line (its checks, its deadline and report),
never a copy into memory the plan no longer owns. One rank of an shm communicator (its own window as the peer).
"""
from __future__ import annotations

import ast

import pytest
import torch
import torch.distributed as dist

from pypto_rt.collective import create_communicator, process
from pypto_rt.errors import OpError, PyptoError
from pypto_rt.ops import distributed
from pypto_rt.replay import comm_run
from pypto_rt.replay.passes import compile_trace

ROWS, H = 4, 8
# a dispatch's lines: counts read from data, a put of that many rows, the count row stored, a signal set and
# awaited (values computed per call); a line that is not communication ends the run
LINES = """s1 = a0[0, 2].item()
comm0(w0, 0, a1, [0, 0], [0, 0], [s1, 8], False)
comm1(w1, 0, [0, 0], False, a0)
comm2(w2, 0, [0, 0], 'set', s0 + 1)
comm3(w2, [0, 0], 'ge', 'moe_exchange', s0 + 1)
s2 = a0[0, 3].item()
v9 = torch_add(a1, s2)
comm2(w2, 0, [0, 1], 'set', s2)
"""


@pytest.fixture
def windows():
    comm = create_communicator("shm", 0, 1, store=dist.HashStore(), timeout_s=1.0)
    process.install(comm)
    try:
        def make(shape, dtype):
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            return process.alloc(nbytes).window.local[:nbytes].view(dtype).view(shape)
        yield make([ROWS, H], torch.float32), make([1, 4], torch.int32), make([1, 2], torch.int32)
    finally:
        process.close()


@pytest.fixture
def effects_called(monkeypatch):
    """How many times each effect class ran its own call (not the fast function's lines)."""
    seen = {}
    for cls in (distributed._PutBox, distributed._StoreBox, distributed._Notify, distributed._Wait):
        def counted(self, *args, _real=cls.__call__, _name=cls.__name__):
            seen[_name] = seen.get(_name, 0) + 1
            return _real(self, *args)
        monkeypatch.setattr(cls, "__call__", counted)
    return seen


def _constants():
    return {"comm0": distributed._put_box.bind(), "comm1": distributed._store_box.bind(),
            "comm2": distributed._notify_cell.bind(), "comm3": distributed._wait_cell.bind(), "torch_add": torch.add}


def _fused(constants):
    return comm_run.fused(ast.parse(LINES).body, constants, "_run")


def test_runs_of_communication_lines_and_reads_become_one_call_and_the_rest_stays_in_place():
    statements, runs = _fused(_constants())
    assert [ast.unparse(s) for s in statements] == [
        "s1, s2 = _run0(a0, w0, a1, w1, w2, s0)", "v9 = torch_add(a1, s2)",
        "comm2(w2, 0, [0, 1], 'set', s2)"]   # (a run of one line stays as it is)
    assert list(runs) == ["_run0"] and runs["_run0"].outputs == ["s1", "s2"]


def test_every_call_writes_what_the_recorded_lines_write_and_the_run_goes_fast_after_two(windows, effects_called):
    w0, w1, w2 = windows
    run = _fused(_constants())[1]["_run0"]
    counts, values = torch.zeros(1, 4, dtype=torch.int32), torch.zeros(ROWS, H)
    for call, rows in enumerate([2, 2, 3, 0, 4, 1, 4]):
        counts.copy_(torch.tensor([[7, call, rows, 10 + call]]))   # (in place: the same tensor objects every call)
        values.copy_(torch.randn(ROWS, H, generator=torch.Generator().manual_seed(call)))
        before = w0.clone()
        assert run(counts, w0, values, w1, w2, 5 * call) == (rows, 10 + call)
        before[:rows] = values[:rows]
        assert torch.equal(w0, before), call
        assert torch.equal(w1, counts) and int(w2[0, 0]) == 5 * call + 1, call
        assert (run.fast is not None) == (call >= 1), call   # planned after the second call
    # the recorded lines ran in the first two calls only: the other five ran as the fast function's lines
    assert effects_called == {"_PutBox": 2, "_StoreBox": 2, "_Notify": 2, "_Wait": 2}


def _gone_fast(windows) -> tuple:
    """(run, its count row, its values) after the three calls that plan its fast function."""
    w0, w1, w2 = windows
    run = _fused(_constants())[1]["_run0"]
    counts, values = torch.tensor([[0, 0, 2, 0]], dtype=torch.int32), torch.ones(ROWS, H)
    for call in range(3):
        run(counts, w0, values, w1, w2, call)
    assert run.fast is not None
    return run, counts, values


def test_a_count_past_the_room_runs_the_recorded_put_and_fails_as_it_does(windows):
    w0, w1, w2 = windows
    run, counts, values = _gone_fast(windows)
    counts[0, 2] = ROWS + 1
    with pytest.raises(OpError, match="does not fit"):
        run(counts, w0, values, w1, w2, 3)


def test_a_line_whose_operand_is_made_anew_each_call_runs_as_recorded_and_the_others_go_fast(windows,
                                                                                               effects_called):
    w0, w1, w2 = windows
    run = _fused(_constants())[1]["_run0"]
    counts = torch.tensor([[0, 0, 3, 0]], dtype=torch.int32)
    for call in range(6):
        source = torch.full((ROWS, H), float(call))   # (a put's source made anew: a temporary of the call)
        run(counts, w0, source, w1, w2, call)
        assert torch.equal(w0[:3], source[:3]) and int(w2[0, 0]) == call + 1, call
    assert run.fast is not None
    assert effects_called == {"_PutBox": 6, "_StoreBox": 2, "_Notify": 2, "_Wait": 2}


def test_other_tensors_miss_the_guard_run_as_recorded_and_plan_anew_a_bounded_number_of_times(windows, monkeypatch):
    """A count row swapped for another misses the guard; the next plan leaves that row's lines (its reads, its
    store) recorded, the others fast. Every call right; past MAX_PLANS plans a run stays as recorded."""
    w0, w1, w2 = windows
    counts = [torch.tensor([[0, 0, 3, 0]], dtype=torch.int32), torch.tensor([[0, 0, 1, 5]], dtype=torch.int32)]
    values = torch.randn(ROWS, H)
    for plans in (comm_run.MAX_PLANS, 1):
        monkeypatch.setattr(comm_run, "MAX_PLANS", plans)
        run = _fused(_constants())[1]["_run0"]
        for call, which in enumerate([0, 0, 0, 1, 1, 0, 1, 0, 1]):
            row = counts[which]
            assert run(row, w0, values, w1, w2, call) == (int(row[0, 2]), int(row[0, 3])), call
            rows = int(row[0, 2])
            assert torch.equal(w1, row) and int(w2[0, 0]) == call + 1 and torch.equal(w0[:rows], values[:rows]), call
        assert run.plans == min(plans, 2) and (run.fast is None) == (plans == 1), plans


def test_a_wait_whose_cell_is_not_there_runs_the_recorded_wait_with_its_deadline_and_report(windows):
    w0, w1, w2 = windows
    lines = LINES.replace("'moe_exchange', s0 + 1)", "'moe_exchange', s4)")   # (a value the test chooses)
    run = comm_run.fused(ast.parse(lines).body, _constants(), "_run")[1]["_run0"]
    counts, values = torch.tensor([[0, 0, 1, 0]], dtype=torch.int32), torch.ones(ROWS, H)
    for call in range(3):
        run(counts, w0, values, w1, w2, call, call + 1)
    assert run.fast is not None
    with pytest.raises(PyptoError, match="moe_exchange"):   # (the communicator's timeout: 1 s)
        run(counts, w0, values, w1, w2, 3, 9)


def test_a_closed_window_misses_the_guard_and_the_recorded_line_refuses_it(windows):
    w0, w1, w2 = windows
    run, counts, values = _gone_fast(windows)
    process.close()
    with pytest.raises(OpError, match="must be a window tensor"):
        run(counts, w0, values, w1, w2, 3)


def test_the_fused_function_gives_the_unfused_lines_results():
    """Without windows: effects with no plan (plain functions) run as recorded, in order, in both."""
    calls = []
    constants = {f"comm{i}": type("Effect", (), {"repeat": lambda self, t: None,
                                                  "__call__": lambda self, *a, i=i: calls.append((i, _plain(a)))})()
                 for i in range(4)} | {"torch_add": torch.add}
    statements, runs = comm_run.fused(ast.parse(LINES).body, constants, "_run")
    source = "def f(a0, a1, s0):\n" + "".join(f"    {line}\n" for line in LINES.splitlines()) + \
        "    return (s1, s2, v9)\n"
    fused = "def f(a0, a1, s0):\n" + "".join(f"    {ast.unparse(s)}\n" for s in statements) + \
        "    return (s1, s2, v9)\n"
    got = []
    for text, names in ((source, constants), (fused, {**constants, **runs})):
        calls.clear()
        fn = compile_trace(text.replace("(a0, a1, s0)", "(a0, a1, s0, w0=None, w1=None, w2=None)"), names)
        counts = torch.tensor([[1, 2, 3, 4]], dtype=torch.int32)
        for call in range(4):
            counts[0, 2] = call   # (the same tensor each call: its reads go fast from the second call's plan on)
            result = fn(counts, torch.ones(2, 2), 5)
        got.append((result[:2], result[2].tolist(), list(calls)))
    assert got[0] == got[1] and got[0][0] == (3, 4) and len(got[0][2]) == 4 * 5
    assert runs["_run0"].fast is not None   # (reads only: the effects have no plan)


def _plain(args: tuple) -> list:
    return [a.tolist() if isinstance(a, torch.Tensor) else a for a in args]
