"""The `pld` ops (spec §4.10, runtime_model §4.3): signals and one-sided window access.

Window operands are views of `pld.window` buffers; each op finds its window, communicator and byte offsets
through `pypto_rt.collective.process` and acts on the peer's memory directly (the `shm` communicator maps every
rank's window). Semantics:
- `system.notify(target, peer=, offsets=, value=, op=AtomicAdd|Set)`: the INT32 cell `target[offsets]` on rank
  `peer` is atomically increased by, or set to, `value` (atomic across processes);
- `system.wait(signal=, offsets=, expected=, cmp=Ge|Eq)`: block until this rank's cell compares true, backing
  off, with the PYPTO_TIMEOUT_S deadline and a wait report naming the cell, the value seen and expected;
- `tile.remote_load(target, peer=, offsets=, shape=)`: a copy of peer's `target[offsets : +shape]`;
- `tile.remote_store` / `tensor.remote_store(src, target, peer=, offsets=, atomic=)`: write (or with
  `atomic=pl.AtomicType.Add` atomically add) `src` into peer's `target[offsets : +src.shape]`;
- `tensor.put(dst=, peer=, src=, dst_offsets=, src_offsets=, shape=, atomic=)`: local `src[src_offsets : +shape]`
  into peer's window `dst` at `dst_offsets`; `tensor.get(dst=, peer=, src=, ...)`: peer's window `src` region
  into the local `dst` (chunking/pipelining hints are accepted and ignored; `get` declares the tensor it writes,
  `writes=`, so a later region reading it waits for it);
- the collectives (`allreduce`, `allgather`, ...) are pypto_rt.ops.collectives'.
notify, wait, remote_store and put apply their effect on their operands (window tensors, peer, offsets, values)
through `recording.communicate`, so a run recorded for replay records it as one call (replay.comm_block). An effect
keeps its window operand resolved between calls (`_Effect`: revalidated by address, shape, strides, dtype and
process.epoch()); on the `shm` communicator a store or put is one `copy_` into a strided view of the peer's window
(one `memmove` by address where both boxes are contiguous runs of whole rows: a torch view and copy cost ~8 us),
a `Set` notify is the window's `publish` (the communicator's signal write, same ordering, without its checks) and a
wait whose cell already holds its value returns at once (atomic adds and other communicators go through the
communicator's calls).
"""
from __future__ import annotations

import weakref

import torch

from pypto_rt.collective import addresses, process
from pypto_rt.errors import OpError
from pypto_rt.language.enums import NotifyOp, WaitCmp
from pypto_rt.ops import recording
from pypto_rt.ops.dtype_rules import from_torch
from pypto_rt.ops.registry import op
from pypto_rt.ops.value import TensorValue, valid_region


def _tensor(x) -> torch.Tensor:
    return x.data if isinstance(x, TensorValue) else x


def _window(name: str, x, what: str):
    """(buffer, byte offset of x's first element) of a window operand; an OpError naming the op otherwise."""
    recording.refuse(f"pld.{name} communicates with other ranks")
    data = _tensor(x)
    found = process.window_of(data) if isinstance(data, torch.Tensor) else None
    if found is None:
        raise OpError(f"pld.{name}: `{what}` must be a window tensor (a pld.DistributedTensor bound to a pld.window "
                      f"view), got {x!r}", hint="allocate it with pld.alloc_window_buffer and view it with pld.window")
    return found


def _peer(name: str, buf, peer) -> int:
    peer = int(peer)
    if not 0 <= peer < buf.comm.world_size:
        raise OpError(f"pld.{name}: peer {peer} is outside the job's ranks 0..{buf.comm.world_size - 1}")
    return peer


def _extent(name: str, dims, offsets, shape, what: str) -> tuple[list[int], list[int]]:
    """(offsets, shape) of the box at `offsets` of a tensor of shape `dims` (shape defaults to the rest of each
    axis), bounds-checked."""
    offsets = [int(o) for o in offsets]
    shape = [s - o for s, o in zip(dims, offsets)] if shape is None else [int(s) for s in shape]
    if not (len(offsets) == len(shape) == len(dims)) or any(
            o < 0 or n < 0 or o + n > s for o, n, s in zip(offsets, shape, dims)):
        raise OpError(f"pld.{name}: the box at {offsets} of shape {shape} does not fit `{what}` of shape "
                      f"{list(dims)}")
    return offsets, shape


def _box(name: str, data: torch.Tensor, offsets, shape, what: str) -> torch.Tensor:
    """The view data[offsets : offsets + shape] (shape defaults to the rest of each axis), bounds-checked."""
    offsets, shape = _extent(name, data.shape, offsets, shape, what)
    for axis, (o, n) in enumerate(zip(offsets, shape)):
        data = data.narrow(axis, o, n)
    return data


def _index(offsets: list[int], strides) -> int:
    """Elements from a tensor's first element to the one at `offsets`."""
    return sum(o * s for o, s in zip(offsets, strides))


def _row_run(shape, strides) -> int | None:
    """Elements per row when a box of `shape` (any leading count) under `strides` is one contiguous run, else
    None: its trailing axes are C-contiguous and its rows follow one another."""
    expected = 1
    for n, s in zip(reversed(shape[1:]), reversed(strides[1:])):
        if n != 1 and s != expected:
            return None
        expected *= n
    return expected if len(shape) and strides[0] == expected else None


def _byte_run(target_view: torch.Tensor, source: torch.Tensor, target_strides, source_strides, shape,
              source_offset: int) -> tuple[int, int, int] | None:
    """(target address, bytes per row, source byte offset from source.data_ptr()) for a copy of `shape` that
    needs no torch op: both boxes contiguous runs, the same dtype, CPU memory; else None."""
    if source.dtype != target_view.dtype or not source.is_cpu or not target_view.is_cpu:
        return None
    row, source_row = _row_run(shape, target_strides), _row_run(shape, source_strides)
    if row is None or source_row != row:
        return None
    item = source.element_size()
    return target_view.data_ptr(), row * item, source_offset * item


def _pieces(view: torch.Tensor, values: torch.Tensor):
    """(contiguous piece of `view`, the same elements of `values`), the leading axes iterated until the rest
    of `view` is contiguous; `values` has view's shape."""
    if view.is_contiguous() or view.numel() == 0:
        yield view.reshape(-1), values.reshape(-1)
        return
    if view.dim() == 1:
        for i in range(view.shape[0]):
            yield view[i:i + 1], values[i:i + 1]
        return
    for i in range(view.shape[0]):
        yield from _pieces(view[i], values[i])


class _Effect:
    """A `pld` op's effect on its operands, what replay.comm_block records as one line; `bind()` gives each recorded
    line its own. Its window operand stays resolved between calls: (buffer, byte offset of the operand's first
    element, every rank's window as elements of the operand's dtype where this process maps them, else None), looked
    up again only when the key changes: the tensor's address and its storage's (process.window_of finds windows by
    storage), shape, strides, dtype and process.epoch() (a window allocated or freed since, so a replay with other
    windows finds those). The buffer is held weakly: a line kept by a replay never keeps a freed window's memory
    mapped. A call that repeats the line's latest one with the very same tensor objects (a replay's arguments and
    windows) skips even those keys (`again`): ~1 us of each 2-4 us line, 64 lines a call at 8-rank MoE decode.
    `repeat` says what such a call comes to (a memmove, a publish, a cell read), for replay.comm_run, which runs a
    replay's run of lines as one call with one guard."""

    def __init__(self):
        self._last: tuple | None = None   # (key, weak buffer, offset, typed?) of the latest operand: one swap
        self._plan: tuple | None = None   # (key, plan): what the latest arguments computed to (`planned`)
        self._again: tuple | None = None   # the latest call as `again` checks it (`remember`)

    def bind(self) -> "_Effect":
        return type(self)()

    def window(self, name: str, x, what: str) -> tuple:
        if not isinstance(x, torch.Tensor):
            _window(name, x, what)   # raises: not a window tensor
        key = (x.data_ptr(), x.untyped_storage().data_ptr(), x.shape, x.stride(), x.dtype, process.epoch())
        last = self._last
        buf = last[1]() if last is not None and last[0] == key else None
        if buf is None:
            buf, offset = _window(name, x, what)
            typed = hasattr(buf.window, "typed") and offset % x.element_size() == 0
            self._last = last = (key, weakref.ref(buf), offset, typed)
        return buf, last[2], buf.window.typed(x.dtype) if last[3] else None

    def planned(self, key: tuple):
        """The plan kept for `key` (this operand's resolution, `self._last[0]`, and the other arguments), or None.
        A plan is what checked arguments computed to (peer, boxes, byte offsets): a recorded line is called with the
        same ones call after call, so it is checked once; arguments that differ in any way are checked anew."""
        plan = self._plan
        return plan[1] if plan is not None and plan[0] == key else None

    def keep(self, key: tuple, plan) -> None:
        self._plan = (key, plan)

    def again(self, tensors: tuple, rest: tuple) -> tuple | None:
        """(window buffer, what `remember` kept) of this line's latest call where this call repeats it: the very
        tensor objects at the same addresses, the other arguments equal, the job's windows unchanged
        (process.epoch()) and the window open; else None. An object at the same address keeps its sizes and
        strides (no op here changes an operand's in place; a replay guards its arguments' and makes its
        temporaries anew each call), so this skips reading them (~1 us a tensor), what the keys above compare."""
        seen = self._again
        return None if seen is None or seen[2] != rest else self._same(seen, tensors)

    def _same(self, seen: tuple, tensors: tuple) -> tuple | None:
        if seen[3] != process.epoch():
            return None
        for ref, address, t in zip(seen[0], seen[1], tensors):
            if ref() is not t or address != t.data_ptr():
                return None
        buf = seen[4]()
        return None if buf is None or buf.window.closed else (buf, seen[5])

    def repeat(self, tensors: tuple) -> tuple | None:
        """(window buffer, plan) of a call that repeats this line's latest one with the very `tensors` and the same
        other arguments (the caller's part: replay.comm_run fuses only lines whose other arguments are literals,
        and the numbers a plan takes per call), or None: what replay.comm_run runs instead of the line. A plan:
        ("publish", peer, cell) a set notify; ("cell", rank, index, "ge"|"eq") a wait's cell; ("memmove",
        target address, bytes) a store from its values' first byte; ("rows", byte run, room, default rows) a
        put as `copy_rows` (its source's address, a row count up to `room`)."""
        seen = self._again
        found = None if seen is None else self._same(seen, tensors)
        plan = None if found is None else self._plan_of(seen[2], found[1])
        return None if plan is None else (found[0], plan)

    def _plan_of(self, rest: tuple, done) -> tuple | None:
        return None

    def remember(self, tensors: tuple, rest: tuple, buf, done) -> None:
        """Keep `done` (numbers only: nothing that holds a window's memory) for `again`."""
        self._again = (tuple(map(weakref.ref, tensors)), tuple(t.data_ptr() for t in tensors), rest,
                       process.epoch(), weakref.ref(buf), done)

    def cell(self, name: str, x, offsets, what: str) -> tuple:
        """(buffer, byte offset, offsets as ints) of the INT32 signal cell x[offsets]."""
        buf, offset, _ = self.window(name, x, what)
        key = (self._last[0], *offsets)
        kept = self.planned(key)
        if kept is not None:
            return buf, kept[0], kept[1]
        if x.dtype != torch.int32:
            raise OpError(f"pld.{name}: the signal `{what}` must be INT32, got {x.dtype}")
        at, _ = _extent(name, x.shape, offsets, [1] * x.dim(), what)
        kept = (offset + 4 * _index(at, x.stride()), at)
        self.keep(key, kept)
        return buf, kept[0], kept[1]


def _write(name: str, found: tuple, target: torch.Tensor, peer, offsets, atomic: bool, values: torch.Tensor,
           what: str) -> int | None:
    """Write (or atomically add) `values` into rank `peer`'s elements under the box of `target` (a window operand,
    `found` its resolution) at `offsets`: one copy into a strided view of the peer's window where this process maps
    it (returns the box's first element in it), else through the communicator one contiguous run at a time (and for
    atomic adds, which take its lock; returns None)."""
    buf, offset, typed = found
    peer = _peer(name, buf, peer)
    at, shape = _extent(name, target.shape, offsets, list(values.shape), what)
    if typed is None or atomic or buf.window.closed:
        view = target
        for axis, (o, n) in enumerate(zip(at, shape)):
            view = view.narrow(axis, o, n)
        _store(buf, peer, view, atomic, values)
        return None
    start = offset // target.element_size() + _index(at, target.stride())
    if values.numel():
        typed[peer].as_strided(shape, target.stride(), start).copy_(values)
    return start


# ------------------------------------------------------------------------------------------------ signals

@op("pld.system.notify")
def notify(target, peer, offsets, value=1, op=NotifyOp.AtomicAdd):
    kind = "set" if op in (NotifyOp.Set, "set") else "atomic_add"
    recording.communicate("pld.system.notify communicates with other ranks", _notify_cell,
                          (_tensor(target), peer, offsets, kind, value))


class _Notify(_Effect):
    def __call__(self, target, peer, offsets, kind: str, value) -> None:
        rest = (peer, kind, *offsets)
        repeat = self.again((target,), rest)
        if repeat is not None:   # a `set` published before: (peer, cell)
            repeat[0].window.publish(*repeat[1], int(value))
            return
        buf, offset, _ = self.cell("system.notify", target, offsets, "target")
        peer = _peer("system.notify", buf, peer)
        publish = getattr(buf.window, "publish", None)
        if kind == "set" and publish is not None and offset % 4 == 0 and not buf.window.closed:
            publish(peer, offset // 4, int(value))   # the cell is in the window (self.cell checked the box)
            self.remember((target,), rest, buf, (peer, offset // 4))
            return
        buf.comm.notify(buf.window, peer, offset, int(value), kind)

    def _plan_of(self, rest: tuple, done) -> tuple:
        return ("publish", *done)


@op("pld.system.wait")
def wait(signal, offsets, expected, cmp=WaitCmp.Ge):
    kind = "eq" if cmp in (WaitCmp.Eq, "eq") else "ge"
    recording.communicate("pld.system.wait communicates with other ranks", _wait_cell,
                          (_tensor(signal), offsets, kind, process.current_label(), expected))


class _Wait(_Effect):
    def __call__(self, signal, offsets, kind: str, label, expected) -> None:
        rest = (kind, *offsets)
        repeat = self.again((signal,), rest)
        if repeat is not None:   # a cell read before: (rank, cell, its offsets, the peers that set it)
            buf, (rank, index, cell, peers) = repeat
            expected = int(expected)
            seen = buf.window.cells(rank)[index]
            if not ((seen >= expected) if kind == "ge" else (seen == expected)):
                buf.comm.wait(buf.window, 4 * index, expected, kind, label=label, cell=cell, peers=peers)
            return
        buf, offset, cell = self.cell("system.wait", signal, offsets, "signal")
        comm, expected = buf.comm, int(expected)
        # the [NR, ...] signal convention: row r is the cell rank r notifies (named in a hang's wait-for picture)
        rows = signal.shape[0] if signal.dim() else 0
        peers = [cell[0]] if rows == comm.world_size and cell and cell[0] != comm.rank else None
        cells = getattr(buf.window, "cells", None)
        if cells is not None and offset % 4 == 0 and not buf.window.closed:
            seen = cells(comm.rank)[offset // 4]   # already there: no wait to set up
            self.remember((signal,), rest, buf, (comm.rank, offset // 4, cell, peers))
            if (seen >= expected) if kind == "ge" else (seen == expected):
                return
        comm.wait(buf.window, offset, expected, kind, label=label, cell=cell, peers=peers)

    def _plan_of(self, rest: tuple, done) -> tuple:
        return ("cell", done[0], done[1], rest[0])


_notify_cell, _wait_cell = _Notify(), _Wait()


# ------------------------------------------------------------------------------------------ one-sided access

def _load(buf, peer: int, view: torch.Tensor) -> torch.Tensor:
    """A copy of rank `peer`'s bytes under `view` (a view of this rank's window): one read of the span."""
    if view.numel() == 0:
        return torch.empty(view.shape, dtype=view.dtype)
    item = view.element_size()
    last = sum((n - 1) * s for n, s in zip(view.shape, view.stride()))
    span = buf.comm.remote_load(buf.window, peer, view.data_ptr() - buf.base, (last + 1) * item, view.dtype)
    return span.as_strided(view.shape, view.stride()).clone()


def _store(buf, peer: int, view: torch.Tensor, atomic: bool, src: torch.Tensor) -> None:
    """Write (or atomically add) `src` into rank `peer`'s bytes under `view`, one contiguous run at a time; an empty
    box (a row count read from data may be 0) writes nothing (its flattening has no place in the window)."""
    if view.numel() == 0:
        return
    src = src.to(view.dtype).expand(view.shape).contiguous()
    for piece, values in _pieces(view, src):
        buf.comm.remote_store(buf.window, peer, piece.data_ptr() - buf.base, values, atomic_add=atomic)


def _is_add(atomic) -> bool:
    return atomic is not None and (getattr(atomic, "name", str(atomic)).lower() in ("add", "atomictype.add")
                                   or atomic is True)


@op("pld.tile.remote_load")
def remote_load(target, peer, offsets, shape, valid_shape=None):
    buf, _ = _window("tile.remote_load", target, "target")
    view = _box("tile.remote_load", _tensor(target), offsets, shape, "target")
    data = _load(buf, _peer("tile.remote_load", buf, peer), view)
    dtype = target.dtype if isinstance(target, TensorValue) else from_torch(data.dtype)
    return TensorValue(data, dtype, valid_shape, is_tile=True)


@op("pld.tile.remote_store", "pld.tensor.remote_store")
def remote_store(src, target, peer, offsets, atomic=None):
    # a tile stores its valid box, as pl.store does (a ragged tile's padding stays home)
    values = valid_region(src) if isinstance(src, TensorValue) else src
    recording.communicate("pld.remote_store communicates with other ranks", _store_box,
                          (_tensor(target), peer, offsets, _is_add(atomic), values))


class _StoreBox(_Effect):
    """A store's plan (peer, box, target strides and first element) is kept for the same arguments: a recorded line
    stores the same box call after call (a dispatch's count row), with that call's values."""

    def __call__(self, target, peer, offsets, atomic: bool, values: torch.Tensor) -> None:
        rest = (peer, atomic, *offsets)
        repeat = self.again((target, values), rest)
        if repeat is not None and repeat[1][4] is not None:   # (a byte run: `kept` below)
            _memmove(repeat[1][4][0], values.data_ptr(), repeat[1][4][1])
            return
        found = self.window("remote_store", target, "target")
        key = (self._last[0], values.shape, values.stride(), values.dtype, values.is_cpu, *rest)
        kept = self.planned(key)   # (peer, box, target strides, first element, byte run or None)
        if kept is not None and not found[0].window.closed:
            self.remember((target, values), rest, found[0], kept)
            run = kept[4]
            if run is not None:
                _memmove(run[0], values.data_ptr(), run[1])
            else:
                found[2][kept[0]].as_strided(kept[1], kept[2], kept[3]).copy_(values)
            return
        start = _write("remote_store", found, target, peer, offsets, atomic, values, "target")
        if start is not None and values.numel():   # a plain copy into a mapped window: the same arguments, the same box
            box = tuple(values.shape)
            run = _byte_run(found[2][int(peer)][start:], values, target.stride(), values.stride(), box, 0)
            self.keep(key, (int(peer), box, target.stride(), start,
                            None if run is None else (run[0], run[1] * box[0])))

    def _plan_of(self, rest: tuple, kept) -> tuple | None:
        return None if kept[4] is None else ("memmove", *kept[4])


@op("pld.tensor.put")
def put(dst, peer, src, dst_offsets=None, src_offsets=None, shape=None, atomic=None, **_hints):
    recording.communicate("pld.tensor.put communicates with other ranks", _put_box,
                          (_tensor(dst), peer, _tensor(src), dst_offsets, src_offsets, shape, _is_add(atomic)))


class _PutBox(_Effect):
    """A put's plan is kept for every leading extent: a row count read from data (a dispatch's live rows) changes
    from call to call, and any count up to the rows both boxes have room for copies the same way. A source whose
    leading rows are the target's very bytes (a staging mapped onto the peers' windows, collective.peer_blocks)
    copies nothing for up to that many rows."""

    def __call__(self, dst, peer, local: torch.Tensor, dst_offsets, src_offsets, shape, atomic: bool) -> None:
        rows = int(shape[0]) if shape else None   # (None: the box's default extent)
        rest = (peer, atomic, *(dst_offsets or ()), None, *(src_offsets or ()), None, *(shape[1:] if shape else ()))
        repeat = self.again((dst, local), rest)
        kept = None if repeat is None else repeat[1]
        if kept is not None and kept[8] is not None and (rows is None or 0 <= rows <= kept[1]):
            copy_rows(kept[8], local.data_ptr(), kept[2] if rows is None else rows)   # (`kept` below)
            return
        found = self.window("tensor.put", dst, "dst")
        key = (self._last[0], local.shape, local.stride(), local.storage_offset(), local.dtype, local.is_cpu, *rest)
        kept = self.planned(key)   # (peer, room, default rows, rest of the box, source strides, source offset,
        #                           target strides, target offset, byte run or None: (target address, bytes
        #                           a row, source byte offset, leading rows already in place, the source
        #                           address that holds for: `copy_rows`)
        if kept is not None and not found[0].window.closed and (rows is None or 0 <= rows <= kept[1]):
            self.remember((dst, local), rest, found[0], kept)
            box = (kept[2] if rows is None else rows, *kept[3])
            run = kept[8]
            if run is not None:   # (bounds: rows <= room, checked above)
                copy_rows(run, local.data_ptr(), box[0])
            elif box[0] and all(box):
                found[2][kept[0]].as_strided(box, kept[6], kept[7]).copy_(local.as_strided(box, kept[4], kept[5]))
            return
        at, shape = _extent("tensor.put", local.shape, src_offsets or [0] * local.dim(), shape, "src")
        values = local.as_strided(shape, local.stride(), local.storage_offset() + _index(at, local.stride()))
        to = dst_offsets or [0] * dst.dim()
        start = _write("tensor.put", found, dst, peer, to, atomic, values, "dst")
        if start is not None and shape:   # a plain copy into a mapped window: the same arguments copy the same boxes
            room = min(local.shape[0] - at[0], dst.shape[0] - int(to[0]))
            run = _byte_run(found[2][int(peer)][start:], local, dst.stride(), local.stride(), shape,
                            values.storage_offset() - local.storage_offset())
            if run is not None:   # + the leading rows whose source is the target's very bytes (peer_blocks)
                same = getattr(found[0].window, "same_run", None)
                run = (*run, 0 if same is None or not run[1] else
                       same(int(peer), run[0], local.data_ptr() + run[2]) // run[1], local.data_ptr())
            self.keep(key, (int(peer), room, shape[0], tuple(shape[1:]), local.stride(), values.storage_offset(),
                            dst.stride(), start, run))

    def _plan_of(self, rest: tuple, kept) -> tuple | None:
        return None if kept[8] is None else ("rows", kept[8], kept[1], kept[2])


def copy_rows(run: tuple, source: int, rows: int) -> None:
    """Copy `rows` rows of a put's kept byte run from the source tensor at address `source`, but none of them
    when they are already the target's bytes (the run's leading rows in place, for the source it was planned on:
    another tensor of the same layout copies)."""
    if run[1] and rows > (run[3] if source == run[4] else 0):
        _memmove(run[0], source + run[2], rows * run[1])


_store_box, _put_box = _StoreBox(), _PutBox()
_memmove = addresses.copy   # (target address, source address, bytes): a kept plan's byte run


@op("pld.tensor.get", writes="dst")
def get(dst, peer, src, dst_offsets=None, src_offsets=None, shape=None, **_hints):
    buf, _ = _window("tensor.get", src, "src")
    view = _box("tensor.get", _tensor(src), src_offsets or [0] * _tensor(src).dim(), shape, "src")
    local = _tensor(dst)
    _box("tensor.get", local, dst_offsets or [0] * local.dim(), list(view.shape), "dst").copy_(
        _load(buf, _peer("tensor.get", buf, peer), view))
    return dst
