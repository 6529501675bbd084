"""A bound pld effect (what a recorded line calls) checks its arguments once: a call with the same ones reuses the
plan (peer, boxes, offsets) and copies the call's values; any other argument is checked anew."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pypto_rt.collective import create_communicator, peer_blocks, process
from pypto_rt.errors import OpError
from pypto_rt.ops import distributed


@pytest.fixture
def window():
    comm = create_communicator("shm", 0, 1, store=dist.HashStore())
    process.install(comm)
    try:
        def make(shape, dtype=torch.float32):
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            return process.alloc(nbytes).window.local[:nbytes].view(dtype).view(shape)
        yield make
    finally:
        process.close()


@pytest.fixture
def extents(monkeypatch):
    """How many boxes were checked (distributed._extent calls)."""
    seen = [0]
    real = distributed._extent

    def counted(*args, **kwargs):
        seen[0] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(distributed, "_extent", counted)
    return seen


def test_a_put_with_the_same_arguments_is_checked_once_and_copies_each_calls_values(window, extents):
    win, put = window([4, 8]), distributed._put_box.bind()
    local = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    put(win, 0, local, [2, 0], [0, 4], [2, 4], False)
    checked = extents[0]
    assert checked > 0 and torch.equal(win[2:4, 0:4], local[0:2, 4:8])
    for values in (local * 10, local + 0.5):   # new tensors, same layout: the kept plan, this call's values
        put(win, 0, values, [2, 0], [0, 4], [2, 4], False)
        assert torch.equal(win[2:4, 0:4], values[0:2, 4:8])
    assert extents[0] == checked and float(win[:2].abs().sum()) == 0.0
    put(win, 0, local, [0, 4], [0, 4], [2, 4], False)   # another box: checked anew, written there
    assert extents[0] > checked and torch.equal(win[0:2, 4:8], local[0:2, 4:8])


def test_a_put_with_a_bad_argument_after_good_ones_still_fails(window):
    win, put = window([4, 8]), distributed._put_box.bind()
    local = torch.ones(4, 8)
    put(win, 0, local, [2, 0], [0, 0], [2, 4], False)
    with pytest.raises(OpError, match="peer 1 is outside"):
        put(win, 1, local, [2, 0], [0, 0], [2, 4], False)
    with pytest.raises(OpError, match="does not fit"):
        put(win, 0, local, [3, 0], [0, 0], [2, 4], False)
    put(win, 0, local[1:], [2, 0], [0, 0], [2, 4], False)   # another source layout (offset): checked, copied
    assert float(win.sum()) == 8.0


def test_a_put_whose_row_count_changes_each_call_keeps_its_plan_and_its_bounds(window, extents):
    """A dispatch puts the live rows, a count read from data: any count the boxes have room for reuses the plan
    (0 writes nothing); one past the room is checked anew and fails."""
    win, put = window([6, 8]), distributed._put_box.bind()
    local = torch.arange(40, dtype=torch.float32).reshape(5, 8)
    put(win, 0, local, [2, 0], [1, 0], [3, 8], False)   # room: 4 rows in the source from row 1, 4 in the target
    checked = extents[0]
    for rows in (1, 4, 0, 2):
        win.zero_()
        put(win, 0, local, [2, 0], [1, 0], [rows, 8], False)
        assert torch.equal(win[2:2 + rows], local[1:1 + rows]) and float(win.abs().sum()) == float(
            local[1:1 + rows].abs().sum())
    assert extents[0] == checked
    with pytest.raises(OpError, match="does not fit"):
        put(win, 0, local, [2, 0], [1, 0], [5, 8], False)


def test_a_signal_cell_is_resolved_once_per_offsets(window, extents):
    signal = window([2, 2], torch.int32)
    notify, wait = distributed._notify_cell.bind(), distributed._wait_cell.bind()
    for offsets, value in (([0, 1], 3), ([0, 1], 4), ([1, 0], 5)):
        notify(signal, 0, offsets, "set", value)
        wait(signal, offsets, "eq", None, value)
    assert signal.tolist() == [[0, 4], [5, 0]] and extents[0] == 4   # ([0, 1], then [1, 0]) x (notify, wait)


def test_a_store_with_the_same_arguments_is_checked_once_and_a_bad_one_still_fails(window, extents):
    win, store = window([3, 4], torch.int32), distributed._store_box.bind()
    row = torch.arange(4, dtype=torch.int32).reshape(1, 4)
    store(win, 0, [1, 0], False, row)
    checked = extents[0]
    for values in (row * 10, row + 7):   # new tensors: the kept plan, this call's values, the same box
        store(win, 0, [1, 0], False, values)
        assert win[1].tolist() == values[0].tolist()
    assert extents[0] == checked and float(win[0].abs().sum() + win[2].abs().sum()) == 0.0
    with pytest.raises(OpError, match="peer 1 is outside"):
        store(win, 1, [1, 0], False, row)
    with pytest.raises(OpError, match="does not fit"):
        store(win, 0, [3, 0], False, row)
    store(win, 0, [2, 0], False, row)   # another box: checked anew, written there
    assert extents[0] > checked and win[2].tolist() == row[0].tolist()


def test_a_kept_byte_copy_is_never_taken_for_a_source_of_another_dtype_or_layout(window):
    """Whole contiguous rows are copied by address; a later call whose source differs in dtype or layout (same
    shape, same offsets) is planned anew and converted, never copied as the first call's bytes."""
    win, put = window([4, 8]), distributed._put_box.bind()
    local = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    put(win, 0, local, [1, 0], [0, 0], [2, 8], False)   # whole rows: the byte run
    assert torch.equal(win[1:3], local[0:2])
    doubles = local.double() * 3
    put(win, 0, doubles, [1, 0], [0, 0], [2, 8], False)
    assert torch.equal(win[1:3], (local[0:2] * 3))
    transposed = torch.arange(32, dtype=torch.float32).reshape(8, 4).t()   # [4, 8], rows not contiguous
    put(win, 0, transposed, [1, 0], [0, 0], [2, 8], False)
    assert torch.equal(win[1:3], transposed[0:2])
    store = distributed._store_box.bind()
    row = torch.arange(8, dtype=torch.float32).reshape(1, 8)
    store(win, 0, [3, 0], False, row)
    store(win, 0, [3, 0], False, row.to(torch.int32) * 2)   # another dtype: converted
    assert win[3].tolist() == (row[0] * 2).tolist()


def test_a_line_repeated_with_the_very_same_tensors_copies_each_calls_values_and_follows_what_changed(
        window, extents):
    """A replay calls its lines with the same tensor objects call after call (its arguments, its windows): such a
    call repeats the last one's plan without checking the box again, with this call's values; an argument list
    changed in place, or the same tensor object over other memory, is planned anew."""
    win, put, store = window([4, 8]), distributed._put_box.bind(), distributed._store_box.bind()
    local, row, offsets = torch.arange(32, dtype=torch.float32).reshape(4, 8), torch.ones(1, 8), [2, 0]
    for _ in range(2):
        put(win, 0, local, offsets, [1, 0], [2, 8], False)
        store(win, 0, [0, 0], False, row)
    checked = extents[0]
    for rows in (1, 2, 0):
        local.mul_(2)
        row.add_(1)   # written in place: the same objects, this call's values
        put(win, 0, local, offsets, [1, 0], [rows, 8], False)
        store(win, 0, [0, 0], False, row)
        assert torch.equal(win[2:2 + rows], local[1:1 + rows]) and torch.equal(win[0:1], row)
    assert extents[0] == checked
    offsets[0] = 1   # the caller's list changed: another box, checked anew
    for _ in range(2):
        put(win, 0, local, offsets, [1, 0], [2, 8], False)
        assert extents[0] > checked and torch.equal(win[1:3], local[1:3])
    other = torch.arange(100, 132, dtype=torch.float32)
    local.set_(other.untyped_storage(), 0, (4, 8), (1, 4))   # the same object over other memory, rows not contiguous
    put(win, 0, local, offsets, [1, 0], [2, 8], False)
    assert torch.equal(win[1:3], local[1:3])
    with pytest.raises(OpError, match="does not fit"):
        put(win, 0, local, offsets, [1, 0], [4, 8], False)


def test_a_repeated_signal_line_sets_and_reads_each_calls_value(window, extents):
    signal = window([2, 2], torch.int32)
    notify, wait = distributed._notify_cell.bind(), distributed._wait_cell.bind()
    offsets = [1, 1]
    for value in (3, 4, 9):
        notify(signal, 0, offsets, "set", value)
        wait(signal, offsets, "ge", None, value)
    assert signal.tolist() == [[0, 0], [0, 9]] and extents[0] == 2
    offsets[1] = 0   # changed in place: the other cell
    notify(signal, 0, offsets, "set", 5)
    wait(signal, offsets, "eq", None, 5)
    assert signal.tolist() == [[0, 0], [5, 9]]


def test_a_put_from_a_staging_that_is_its_target_copies_nothing_and_another_source_of_that_layout_copies(
        window, monkeypatch):
    """collective.peer_blocks: a staging whose block is this rank's window bytes themselves (one rank: its own
    window) holds the put's rows already, so the kept plan copies none of them; a plain tensor of the same layout
    reuses the plan and is copied (the rows in place hold for the staging's address only)."""
    rows, cols = 4, peer_blocks.PAGE // 16   # a block of whole pages: 4 rows of FP32
    win = window([rows, cols])
    staging = peer_blocks.map_peer_blocks(process.window_of(win)[0].window, 0, rows * cols * 4, cols * 4)
    staging = staging.view(torch.float32).view(rows + 1, cols)   # + the spill row
    copies = [0]
    real = distributed._memmove

    def counted(*args):
        copies[0] += 1
        return real(*args)
    monkeypatch.setattr(distributed, "_memmove", counted)
    put = distributed._put_box.bind()
    for call in range(3):
        staging[:rows] = call + 1.0   # written into the window itself
        put(win, 0, staging, [0, 0], [0, 0], [rows - call, cols], False)
        assert float(win.min()) == float(win.max()) == call + 1.0
    assert copies[0] == 0
    plain = torch.full((rows + 1, cols), 7.0)
    put(win, 0, plain, [0, 0], [0, 0], [rows, cols], False)
    assert copies[0] == 1 and float(win.min()) == 7.0
