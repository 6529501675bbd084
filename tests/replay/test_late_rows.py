"""Replays whose windows take a row count the run computed (replay.late_rows): a MoE receive side gathers each
expert's counted rows, the count read from data the same call wrote.

What users depend on: such a call replays (no kernel block called as it is) and gives the engine's results for
every row count, 0 and the whole tensor included; a replayed window that would leave its tensor raises a clear
error naming the user's line instead of writing the wrong rows; and what the recording cannot size exactly (a
late row count meeting a fixed one, a reshape that moves rows, reading strides) refuses the recording, never
bakes in the recorded count.
"""
from __future__ import annotations

import re

import pytest
import torch

import pypto.language as pl
from pypto_rt import run_stats
from pypto_rt.errors import OpError
from pypto_rt.replay.capture import Recorder
from pypto_rt.replay.passes import compile_trace
from pypto_rt.replay.policy import ReplayPolicy, policy_scope
from pypto_rt.replay.scalars import TracedInt
from pypto_rt.run_stats import REPLAYED

ROWS, COLS = 16, 8
POLICY = ReplayPolicy()
KEEP = dict(slower=float("inf"))   # keep the recordings, whatever the timing says


@pl.jit
def counted_rows(x: pl.Tensor[[ROWS, COLS], pl.FP32], picks: pl.Tensor[[2 * ROWS, 1], pl.INT32],
                 flags: pl.Tensor[[2 * ROWS, 1], pl.INT32], count: pl.InOut[pl.Tensor[[1, 1], pl.INT32]],
                 y: pl.InOut[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="gather_counted"):
        count[:, :] = pl.col_sum(flags)   # written by the call: the count read below is late
        n = pl.read(count, [0, 0])
        y[0:n, :] = pl.mgather(x, picks[0:n, :], coalesce="row")
    return y


def _counted_call(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, COLS, generator=gen)
    picks = torch.randint(0, ROWS, (2 * ROWS, 1), dtype=torch.int32, generator=gen)
    flags = (torch.arange(2 * ROWS) < n).to(torch.int32).reshape(-1, 1)
    y = torch.zeros(ROWS, COLS)
    with run_stats.collect() as stats:
        counted_rows(x, picks, flags, torch.zeros(1, 1, dtype=torch.int32), y)
    want = torch.zeros(ROWS, COLS)
    want[:n] = x[picks[:n, 0].long()]
    return stats.replay, y, want


def test_a_window_whose_row_count_the_call_computed_replays_for_every_count():
    counts = [5, 3, 0, ROWS, 1, 7, 2, 9, 4, 11, 6, 0, 1, 13, ROWS, 2]
    with policy_scope(**KEEP):
        decisions = []
        for i, n in enumerate(counts):
            decision, y, want = _counted_call(n, i)
            assert torch.equal(y, want), f"call {i} (n={n})"
            decisions.append(decision)
    kinds = [d.kind for d in decisions]
    assert kinds[-1] == REPLAYED and kinds.count(REPLAYED) >= len(counts) - POLICY.normal_runs - 1 - \
        POLICY.trial_replays, kinds
    assert "called as they are" not in decisions[-1].reason and "guards" not in decisions[-1].reason, decisions[-1]


def test_a_replayed_window_leaving_its_tensor_raises_an_error_naming_the_line():
    with policy_scope(**KEEP):
        kinds = [_counted_call(4 + i % 3, i)[0].kind for i in range(POLICY.normal_runs + 2)]
        assert kinds[-1] == REPLAYED, kinds
        with pytest.raises(OpError) as error:
            _counted_call(ROWS + 3, 99)   # 19 rows of a 16-row tensor: the engine would pad, a replay cannot
    text = str(error.value) + (error.value.hint or "")
    assert "rows 0:19 of a tensor with 16 rows" in text and "test_late_rows.py:" in text, text
    assert "PYPTO_REPLAY=0" in text, text


def _record(fn, *inputs):
    """fn(recorder, *inputs) recorded; (recorder, the replay function or None where refused)."""
    recorder = Recorder(list(inputs))
    with recorder:
        result = fn(recorder, *inputs)
    if recorder.refused:
        return recorder, None
    recorder.made_source = recorder.source([recorder.name_of(result)])
    return recorder, compile_trace(recorder.made_source, recorder.constants)


def _late_count(recorder, counts: torch.Tensor):
    """counts[0], read from a tensor the run computed (a late value)."""
    made = counts + 0
    return recorder.read_scalar(made, (0,))


def _gather_counted(recorder, table, index, counts, out):
    c = _late_count(recorder, counts)
    rows = index[0:c]
    assert type(rows.shape[0]) is TracedInt and rows.numel() == c   # shape reads answer the traced count
    picked = table.index_select(0, rows.to(torch.int64).reshape(-1))
    out[0:c] = (picked * 2.0).to(out.dtype)
    return out


def test_gathered_rows_cast_reshaped_and_copied_follow_the_count_in_each_replay():
    table, index = torch.randn(8, 4), torch.randint(0, 8, (8, 1), dtype=torch.int32)
    recorder, replayed = _record(_gather_counted, table, index, torch.tensor([5]), torch.zeros(8, 4))
    assert replayed is not None, recorder.refused
    for c in (0, 1, 3, 8):
        out = torch.zeros(8, 4)
        want = torch.zeros(8, 4)
        want[:c] = table[index[:c, 0].long()] * 2.0
        assert torch.equal(replayed(table, index, torch.tensor([c]), out)[0], want), c


@pytest.mark.parametrize("use, why", [
    (lambda t, rows: rows + t, "a fixed number of rows"),                 # [c, 4] + [8, 4]: c == 8 when recorded
    (lambda t, rows: rows.reshape(2, -1), "`reshape` to"),              # moves rows into columns
    (lambda t, rows: rows.t(), "cannot size"),                          # rows become columns
    (lambda t, rows: rows + rows.index_select(0, index=torch.arange(8)), "`index_select`"),   # 8 rows, fixed
    (lambda t, rows: t[0:len(rows)], "`__len__`"),                       # len() reads an int without asking
    (lambda t, rows: t.reshape(-1)[0:rows.nbytes], "`nbytes`"),
    (lambda t, rows: rows.contiguous() if rows.stride(0) == 4 else rows, "`stride`"),
    (lambda t, rows: torch.zeros(rows.shape[0], 4), "data it computed"),   # a size from late data: pinned
])
def test_what_the_recording_cannot_size_exactly_refuses_it(use, why):
    def f(recorder, table, counts):
        c = _late_count(recorder, counts)
        return use(table, table[0:c] * 1.0)

    recorder, replayed = _record(f, torch.randn(8, 4), torch.tensor([8]))
    assert replayed is None and why in recorder.refused, recorder.refused


def _grouped_sums(recorder, table, slots, counts, weights, out):
    """The MoE combine's shape of work: m slots (m late), each the weighted sum of its 2 picked table rows, written
    to its own row of `out`."""
    m = _late_count(recorder, counts)
    group = slots[0:m]                                                    # [m, 1]
    pairs = (group.to(torch.int64) * 2 + torch.tensor([[0, 1]])) % 8      # [m, 2]: broadcast along columns
    picked = table.index_select(0, pairs.reshape(-1)).reshape(m, 2, 4)   # [2m] rows, back to [m, 2, 4]
    part = torch.matmul(weights[0:m].reshape(m, 1, 2), picked).reshape(-1, 4)
    out.index_copy_(0, group.reshape(-1).to(torch.int64), part)
    return out


def test_grouped_row_sums_follow_the_count_through_reshapes_products_and_a_row_scatter():
    table, slots, weights = torch.randn(8, 4), torch.randperm(8).to(torch.int32).reshape(8, 1), torch.randn(8, 2)
    recorder, replayed = _record(_grouped_sums, table, slots, torch.tensor([3]), weights, torch.zeros(8, 4))
    assert replayed is not None, recorder.refused
    for m in (0, 1, 5, 8):
        want = _grouped_sums(_Plain(), table, slots, torch.tensor([m]), weights, torch.zeros(8, 4))
        assert torch.equal(replayed(table, slots, torch.tensor([m]), weights, torch.zeros(8, 4))[0], want), m


class _Plain:
    """Stands in for a recorder outside a recording: reads a number as it is."""

    def read_scalar(self, t, index):
        return int(t[index])


@pytest.mark.parametrize("recorded, columns, replays", [(5, 4, True), (5, 2, True), (1, 2, False)])
def test_contiguity_is_answered_only_where_every_row_count_gives_the_same_course(recorded, columns, replays):
    # rows of all columns are contiguous for any count; some columns are not for 2+ rows, but are for 1 row: a
    # course chosen at 1 row (contiguous) would be wrong for more, so that recording is refused
    def f(recorder, table, counts):
        rows = table[0:_late_count(recorder, counts), 0:columns]
        return rows.view(-1) * 1.0 if rows.is_contiguous() else rows.reshape(-1) * 1.0

    recorder, replayed = _record(f, torch.randn(8, 4), torch.tensor([recorded]))
    assert (replayed is not None) == replays, recorder.refused
    if replays:
        table = torch.randn(8, 4)
        assert torch.equal(replayed(table, torch.tensor([6]))[0], table[0:6, 0:columns].reshape(-1))
    else:
        assert "`is_contiguous`" in recorder.refused, recorder.refused


def test_a_count_is_not_read_before_a_write_to_its_data():
    def f(recorder, counts, x):
        made = counts * 1
        first = recorder.read_scalar(made, (0,))
        made.add_(10)
        return x + first * 100 + recorder.read_scalar(made, (0,))

    recorder, replayed = _record(f, torch.tensor([3]), torch.zeros(2))
    assert replayed is not None, recorder.refused
    assert torch.equal(replayed(torch.tensor([5]), torch.zeros(2))[0], torch.full((2,), 515.0))


def test_counts_read_in_a_loop_are_read_before_its_first_row_write_and_not_before_a_write_to_their_data():
    """A loop reading each step's count (`pl.range` with `pl.read` in its body) replays with its reads moved up to
    where their data was made (replay.passes._early_numbers): its row writes are then one run of torch lines, one
    compiled segment. A read after a write to its data stays after it."""
    def f(recorder, counts, table, out):
        made = counts * 1
        for j in range(3):
            n = recorder.read_scalar(made, (j,))
            out[j * 4 : j * 4 + n] = table[0:n] * (j + 1)
        made.add_(1)
        return out + recorder.read_scalar(made, (0,))

    recorder, replayed = _record(f, torch.tensor([1, 2, 3]), torch.randn(4, 2), torch.zeros(12, 2))
    assert replayed is not None, recorder.refused
    lines = [line.strip() for line in recorder.made_source.splitlines()]
    reads = [i for i, line in enumerate(lines) if line.endswith(".item()")]
    row_writes = [i for i, line in enumerate(lines) if line.startswith("a2[")]
    in_place_add = next(i for i, line in enumerate(lines) if line.startswith("add_"))
    between = lines[reads[0] : reads[2] + 1]   # the reads, and arithmetic on them (Python lines too)
    assert len(reads) == 4 and reads[2] < row_writes[0], recorder.made_source
    assert all(line.endswith(".item()") or re.fullmatch(r"c\d+ = \d+ \+ s\d+", line) for line in between), between
    assert in_place_add < reads[3], recorder.made_source
    counts, table = torch.tensor([4, 0, 2]), torch.randn(4, 2)
    want = torch.zeros(12, 2)
    for j, n in enumerate(counts.tolist()):
        want[j * 4 : j * 4 + n] = table[0:n] * (j + 1)
    assert torch.equal(replayed(counts, table, torch.zeros(12, 2))[0], want + 5)


def test_a_read_with_no_python_line_to_join_stays_and_never_splits_a_tuple_call_from_its_parts():
    """A read moves up only to sit beside another Python line (a read, a communication line): here there is none,
    so it stays where the run read it, after the parts of the sort before it (a compiled segment ending between a
    tuple call and its parts would have to return the tuple, which the compiler refuses)."""
    def f(recorder, counts, x, out):
        made = counts * 1
        out[0:2] = x[0:2] * 3
        values, order = torch.sort(x)
        n = recorder.read_scalar(made, (0,))
        out[2:2 + n] = values[0:n] + order[0:n]
        return out

    recorder, replayed = _record(f, torch.tensor([2]), torch.randn(6), torch.zeros(8))
    assert replayed is not None, recorder.refused
    lines = [line.strip() for line in recorder.made_source.splitlines()]
    sort = next(i for i, line in enumerate(lines) if "= sort_" in line)
    read = next(i for i, line in enumerate(lines) if line.endswith(".item()"))
    assert lines[sort + 1].endswith("[0]") and lines[sort + 2].endswith("[1]") and read == sort + 3, lines
    x = torch.randn(6)
    values, order = torch.sort(x)
    want = torch.zeros(8)
    want[0:2], want[2:5] = x[0:2] * 3, values[0:3] + order[0:3]
    assert torch.equal(replayed(torch.tensor([3]), x, torch.zeros(8))[0], want)
