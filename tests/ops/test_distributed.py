"""The pld ops on one rank's own windows (a one-rank shm communicator): boxes that are not contiguous in the
window, atomic adds, signals, and the errors a misused op gives."""
from __future__ import annotations

import glob

import pytest
import torch
import torch.distributed as dist

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt.collective import create_communicator, process
from pypto_rt.errors import OpError
from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import NotifyOp, WaitCmp
from pypto_rt.ops import OPS
from pypto_rt.ops.value import TensorValue
from pypto_rt.orchestration.program import host_program


@pytest.fixture
def window():
    comm = create_communicator("shm", 0, 1, store=dist.HashStore())
    process.install(comm)
    prefix = comm.prefix
    try:
        def make(shape, dtype=torch.float32):
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            buf = process.alloc(nbytes)
            return buf.window.local[:nbytes].view(dtype).view(shape)
        yield make
    finally:
        process.close()
    assert not glob.glob(f"/dev/shm/{prefix}*")


def tv(t, dtype=D.FP32):
    return TensorValue(t, dtype)


def test_remote_store_and_load_of_a_box_that_is_not_contiguous_in_the_window(window):
    win = window([8, 16])
    src = torch.arange(8, dtype=torch.float32).reshape(2, 4) + 1
    OPS["pld.tile.remote_store"](tv(src), tv(win), peer=0, offsets=[3, 5])
    want = torch.zeros(8, 16)
    want[3:5, 5:9] = src
    assert torch.equal(win, want)   # rows 3-4, columns 5-8 only: nothing written past the box
    got = OPS["pld.tile.remote_load"](tv(win), peer=0, offsets=[3, 5], shape=[2, 4])
    assert torch.equal(got.data, src) and got.is_tile


def test_atomic_remote_store_adds_into_the_box(window):
    win = window([4, 8])
    ones = torch.ones(2, 3)
    for _ in range(3):
        OPS["pld.tensor.remote_store"](tv(ones), tv(win), peer=0, offsets=[1, 2], atomic=True)
    assert float(win[1:3, 2:5].sum()) == 18.0 and float(win.sum()) == 18.0


def test_put_and_get_move_boxes_between_a_local_tensor_and_a_window(window):
    win = window([4, 8])
    local = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    OPS["pld.tensor.put"](dst=tv(win), peer=0, src=tv(local), dst_offsets=[2, 0], src_offsets=[0, 4], shape=[2, 4])
    assert torch.equal(win[2:4, 0:4], local[0:2, 4:8]) and float(win[:2].abs().sum()) == 0.0
    back = torch.zeros(4, 8)
    OPS["pld.tensor.get"](dst=tv(back), peer=0, src=tv(win), dst_offsets=[1, 1], src_offsets=[2, 0], shape=[2, 4])
    assert torch.equal(back[1:3, 1:5], local[0:2, 4:8])


def test_notify_then_wait_on_a_signal_cell(window):
    signal = window([1, 2], torch.int32)
    OPS["pld.system.notify"](tv(signal, D.INT32), peer=0, offsets=[0, 1], value=2, op=NotifyOp.AtomicAdd)
    OPS["pld.system.notify"](tv(signal, D.INT32), peer=0, offsets=[0, 1], value=3, op=NotifyOp.AtomicAdd)
    OPS["pld.system.wait"](signal=tv(signal, D.INT32), offsets=[0, 1], expected=5, cmp=WaitCmp.Eq)
    OPS["pld.system.notify"](tv(signal, D.INT32), peer=0, offsets=[0, 0], value=7, op=NotifyOp.Set)
    assert signal.tolist() == [[7, 5]]


def test_misused_ops_say_which_op_and_what_is_wrong(window):
    win = window([4, 4])
    with pytest.raises(OpError, match="pld.tile.remote_load: `target` must be a window tensor"):
        OPS["pld.tile.remote_load"](tv(torch.zeros(4, 4)), peer=0, offsets=[0, 0], shape=[1, 4])
    with pytest.raises(OpError, match="peer 3 is outside the job's ranks 0..0"):
        OPS["pld.tile.remote_load"](tv(win), peer=3, offsets=[0, 0], shape=[1, 4])
    with pytest.raises(OpError, match="does not fit `target` of shape"):
        OPS["pld.tile.remote_store"](tv(torch.ones(2, 2)), tv(win), peer=0, offsets=[3, 3])
    with pytest.raises(OpError, match="must be INT32"):
        OPS["pld.system.notify"](tv(win), peer=0, offsets=[0, 0], value=1)


N = 4


@pl.jit
def collectives_then_reads(
    x: pl.Tensor[[N, N], pl.FP32],
    data: pl.InOut[pl.Tensor[[N, N], pl.FP32]],
    gathered: pl.InOut[pl.Tensor[[1, N, N], pl.FP32]],
    part: pl.InOut[pl.Tensor[[N, N], pl.FP32]],
    swapped: pl.InOut[pl.Tensor[[N, N], pl.FP32]],
    rows: pl.InOut[pl.Tensor[[N, N], pl.FP32]],
    fetched: pl.InOut[pl.Tensor[[N, N], pl.FP32]],
    y: pl.Out[pl.Tensor[[N, N], pl.FP32]],
    win: pld.DistributedTensor[[N, N], pl.FP32],
):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="reduce"):
        pld.allreduce(data)
        pld.broadcast(data, root=0)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="gather"):
        pld.allgather(gathered, x)
        pld.reduce_scatter(part, x)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="exchange"):
        pld.all_to_all(swapped, x)
        pld.all_to_all_v(rows, x, send_counts=[N], recv_counts=[N])
        pld.tensor.get(dst=fetched, peer=0, src=win, shape=[N, N])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="use"):   # reads what the collectives wrote: RAW edges
        y = pl.store(pl.add(pl.load(rows, [0, 0], [N, N]), pl.load(fetched, [0, 0], [N, N])), [0, 0], y)
    return y


def test_collectives_and_get_write_their_output_tensor_so_later_regions_wait_for_them():
    # a region's access plan decides the task graph's edges: were a collective's output only read, a later
    # region reading it (MoE's receive after its all_to_all_v) would not wait for the collective
    plans = {k.ir.display: {(a.param, a.mode) for a in k.ir.accesses} for k in host_program(collectives_then_reads)
             .kernels}
    assert {("data", "w")} <= plans["reduce"]
    assert {("gathered", "w"), ("part", "w")} <= plans["gather"]
    assert {("swapped", "w"), ("rows", "w"), ("fetched", "w")} <= plans["exchange"]
    assert {("x", "r")} <= plans["gather"] and ("x", "w") not in plans["gather"] | plans["exchange"]


@pytest.mark.parametrize("rows", [0, 1])
def test_a_put_or_store_of_zero_rows_writes_nothing_anywhere_in_the_window(window, rows):
    """A row count read from data may be 0 (a rank that sends nothing): the empty box is no error, wherever
    it lies (an empty view's flattening has no place in the window)."""
    win = window([4, 8])
    local = torch.arange(32, dtype=torch.float32).reshape(4, 8) + 1
    OPS["pld.tensor.put"](dst=tv(win), peer=0, src=tv(local), dst_offsets=[3, 0], src_offsets=[1, 4],
                          shape=[rows, 4])
    OPS["pld.tile.remote_store"](tv(local[2:2 + rows, 0:4]), tv(win), peer=0, offsets=[1, 4])
    want = torch.zeros(4, 8)
    want[3:3 + rows, 0:4] = local[1:1 + rows, 4:8]
    want[1:1 + rows, 4:8] = local[2:2 + rows, 0:4]
    assert torch.equal(win, want)


def test_a_bound_effect_keeps_its_window_resolved_and_finds_another_window_it_is_given(window, monkeypatch):
    """A recorded put (one bound effect per line, replay.comm_block) looks its window up once, not per call; given
    another window of the same shape (a replay called with other windows), or once a window was allocated since
    (process.epoch()), it looks again and writes where the operand now lies."""
    from pypto_rt.ops import distributed

    first, second = window([4, 8]), window([4, 8])
    lookups, real = [], process.window_of
    monkeypatch.setattr(process, "window_of", lambda t: lookups.append(t) or real(t))
    put = distributed._put_box.bind()
    local = torch.arange(32, dtype=torch.float32).reshape(4, 8) + 1
    put(first, 0, local, [1, 2], [0, 0], [2, 3], False)
    put(first, 0, local + 100, [1, 2], [0, 0], [2, 3], False)
    assert len(lookups) == 1 and torch.equal(first[1:3, 2:5], local[:2, :3] + 100)
    put(second, 0, local, [0, 0], [2, 5], [2, 3], False)
    assert len(lookups) == 2 and torch.equal(second[:2, :3], local[2:4, 5:8])
    assert float(first.sum()) == float((local[:2, :3] + 100).sum())   # the first window got nothing more
    window([1])   # a window allocated since: the next call looks its operand up again
    put(second, 0, local, [3, 0], [0, 0], [1, 8], False)
    assert len(lookups) == 3 and torch.equal(second[3], local[0])


def test_a_put_or_store_into_a_mapped_window_is_one_copy_not_a_communicator_call_per_row(window, monkeypatch):
    """On the shm communicator a box that is not contiguous in the window (here 3 and 2 rows) is written with one
    copy into a view of the peer's window; an atomic add still takes the communicator's locked path."""
    win = window([8, 16])
    comm = process.communicator("test")
    stores = []
    monkeypatch.setattr(comm, "remote_store", lambda *a, **k: stores.append(a))
    local = torch.arange(64, dtype=torch.float32).reshape(4, 16) + 1
    OPS["pld.tensor.put"](dst=tv(win), peer=0, src=tv(local), dst_offsets=[2, 3], src_offsets=[1, 4], shape=[3, 5])
    OPS["pld.tile.remote_store"](tv(local[:2, :2].double()), tv(win), peer=0, offsets=[6, 14])
    want = torch.zeros(8, 16)
    want[2:5, 3:8] = local[1:4, 4:9]
    want[6:8, 14:16] = local[:2, :2]
    assert torch.equal(win, want) and stores == []
    OPS["pld.tensor.remote_store"](tv(torch.ones(2, 2)), tv(win), peer=0, offsets=[0, 0], atomic=True)
    assert len(stores) == 2 and torch.equal(win, want)   # two contiguous runs, through the (stubbed) communicator


def test_a_wait_whose_cell_holds_its_value_returns_at_once_and_one_that_never_comes_times_out_naming_it(
        window, monkeypatch):
    from pypto_rt.collective.base import CommTimeoutError

    signal = window([2, 2], torch.int32)
    comm = process.communicator("test")
    signal[1, 1] = 4
    waits, real = [], comm.wait
    monkeypatch.setattr(comm, "wait", lambda *a, **k: waits.append(a) or real(*a, **k))
    OPS["pld.system.wait"](signal=tv(signal, D.INT32), offsets=[1, 1], expected=4, cmp=WaitCmp.Ge)
    OPS["pld.system.wait"](signal=tv(signal, D.INT32), offsets=[1, 1], expected=4, cmp=WaitCmp.Eq)
    assert waits == []   # no wait set up: the cell already holds the value
    monkeypatch.setattr(comm, "timeout_s", 0.2)
    with pytest.raises(CommTimeoutError) as e:
        OPS["pld.system.wait"](signal=tv(signal, D.INT32), offsets=[1, 1], expected=5, cmp=WaitCmp.Eq)
    assert len(waits) == 1 and (e.value.wait["cell"], e.value.wait["seen"], e.value.wait["expected"]) == ([1, 1], 4, 5)


def test_a_bound_effect_does_not_keep_a_freed_window_alive(window):
    """A replay keeps its recorded lines (and their bound effects) as long as its kernel lives: once the job's
    windows are freed, a line must not hold their buffer (or its mapped memory)."""
    import gc
    import weakref

    from pypto_rt.ops import distributed

    win = window([2, 4])
    put = distributed._put_box.bind()
    put(win, 0, torch.ones(2, 4), None, None, None, False)
    buffer = weakref.ref(process.window_of(win)[0])
    process.close()
    gc.collect()
    assert buffer() is None


def test_a_set_notify_on_a_mapped_window_is_the_windows_signal_write_not_a_communicator_call(window, monkeypatch):
    """A `Set` notify on shm writes the cell through the window's publish (the communicator's ordered signal write)
    without comm.notify's per-call checks; an atomic add still takes the communicator's locked path."""
    signal = window([2, 2], torch.int32)
    comm = process.communicator("test")
    notifies, real = [], comm.notify
    monkeypatch.setattr(comm, "notify", lambda *a, **k: notifies.append(a) or real(*a, **k))
    OPS["pld.system.notify"](tv(signal, D.INT32), peer=0, offsets=[1, 0], value=7, op=NotifyOp.Set)
    OPS["pld.system.notify"](tv(signal, D.INT32), peer=0, offsets=[0, 1], value=2**31 + 1, op=NotifyOp.Set)
    assert notifies == [] and signal.tolist() == [[0, -2**31 + 1], [7, 0]]   # wrapped to int32 as comm.notify does
    OPS["pld.system.notify"](tv(signal, D.INT32), peer=0, offsets=[1, 0], value=3, op=NotifyOp.AtomicAdd)
    assert len(notifies) == 1 and signal.tolist() == [[0, -2**31 + 1], [10, 0]]
    with pytest.raises(OpError, match="does not fit"):
        OPS["pld.system.notify"](tv(signal, D.INT32), peer=0, offsets=[2, 0], value=1, op=NotifyOp.Set)


def test_a_remote_store_of_a_ragged_tile_writes_its_valid_box_only(window):
    """As pl.store does: a tile whose valid shape is narrower than its box (a vocabulary's last tile) stores the
    valid columns, and its padding stays home (a full box would run past the target here, or into a neighbour)."""
    win = window([4, 10])
    tile = TensorValue(torch.arange(32, dtype=torch.float32).reshape(4, 8), D.FP32, (4, 3), True)
    OPS["pld.tile.remote_store"](tile, tv(win), peer=0, offsets=[0, 7])
    assert torch.equal(win[:, 7:], tile.data[:, :3]) and float(win[:, :7].abs().sum()) == 0.0
