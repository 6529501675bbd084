"""The `shm` communicator: ranks on one host sharing POSIX shared-memory windows (see segments.py for ownership
and atomicity), with a shared-memory barrier and staged collectives (shm_collectives.py).

Segment names: `<prefix>+c<k>-<kind>-r<rank>` where prefix is PYPTO_SHM_PREFIX (set by the launcher, which then
owns cleanup) or `pypto-<pid>-<random>` chosen by rank 0 (then the communicator owns and unlinks its segments at
close), k counts this rank's communicators, kind is `ctl` (control cells), `w<i>` (window i) or `s<h>g<gen>`
(collective staging, half h, generation gen). `+` ends the prefix (segments.py).

The per-rank control cells (barrier epochs, state, staging generations) are laid out in control.py.
Store order (data before signal): a rank writes data, then its cells; x86-64 (TSO) keeps that order, and other
hosts route signal and epoch writes through the segment lock (the flock syscalls order them).
Waking (futex.py, PYPTO_SHM_BLOCK): every signal or epoch write is followed by a futex wake on its cell, and a
wait that the spin did not satisfy blocks on the cell it awaits, so it gives its core away and wakes on the write
(after yielding polls: a blocked waiter may wake long after the write; PYPTO_SHM_POLL_US fixes how long, unset
poll_policy.py decides per wait from the host's load and the wait site's recent waits).
"""
from __future__ import annotations

import atexit
import os
import platform
import secrets
import time

import torch

from pypto_rt.errors import PyptoError

from . import comm_settings, futex, nodes, store_rendezvous
from .base import (CollectiveMismatchError, CommError, Communicator, PeerAbortedError, Window, check_peer, notify_op,
                   signature, wait_cmp)
from .check import CollectiveCheck
from .control import (ABORTED, CALLS, CLOSED, EPOCH, OP_CODES, OPS, PID, RUNNING, SIZES, STATE, alive, call_text,
                      post_call, reason, set_reason)
from .control import SIZE as CONTROL_SIZE
from .peer_blocks import same_run
from .poll_policy import PollPolicy
from .segments import Segment, SegmentMissing, check_prefix, removed_error, segment_name
from .shm_collectives import StagedCollectives
from .waits import MAX_SLEEP_S, SPIN_POLLS, backoff_wait, describe, timeout_error, wait_record

_ORDERED_STORES = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
OVERSUBSCRIBED_MAX_SLEEP_S = 250e-6   # a wait's longest sleep where the job has more ranks than cores


def _wrap32(v: int) -> int:
    return (int(v) + 2**31) % 2**32 - 2**31


class ShmWindow(Window):
    """A window of the shm communicator: one segment per rank, all mapped here."""

    def __init__(self, name: str, index: int, nbytes: int, segments: list[Segment], rank: int, owner):
        super().__init__(name, index, nbytes)
        self.owner = owner
        self.segments = segments
        self._views = [s.tensor[:nbytes] for s in segments]
        self._typed: dict[torch.dtype, list[torch.Tensor]] = {}
        self._rank = rank

    @property
    def local(self) -> torch.Tensor:
        return self._views[self._rank]

    def peer(self, rank: int) -> torch.Tensor:
        return self._views[rank]

    @property
    def closed(self) -> bool:
        return self.owner._closed

    def typed(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """Every rank's bytes as elements of `dtype` (index r: rank r; element i starts at byte i * itemsize), made
        once per dtype: a one-sided copy into a peer is one `copy_` into a strided view of these."""
        views = self._typed.get(dtype)
        if views is None:
            usable = self.nbytes - self.nbytes % torch.empty(0, dtype=dtype).element_size()
            views = self._typed[dtype] = [v[:usable].view(dtype) for v in self._views]
        return views

    def same_run(self, rank: int, target_address: int, source_address: int) -> int:
        """How many bytes from `source_address` on are rank `rank`'s bytes from `target_address` (an address in
        its mapping here) on: a peer-block staging (peer_blocks) that already holds them; else 0."""
        segment = self.segments[rank]
        return same_run(source_address, segment.name, target_address - segment.address)

    def cells(self, rank: int):
        """Rank `rank`'s bytes as int32 cells (a memoryview: reading one is a plain load, no tensor made)."""
        return self.segments[rank].cells32

    def publish(self, rank: int, index: int, value: int) -> None:
        """Set rank `rank`'s int32 cell `index` (in range: the caller checked) to `value`, ordered after this rank's
        earlier data writes as the communicator's notify(op="set") is: its signal write without its argument checks."""
        segment = self.segments[rank]
        self.owner._publish(segment.cells32, index, _wrap32(value), segment)


class ShmCommunicator(StagedCollectives, Communicator):
    """Ranks of one host. `store`: a torch.distributed Store shared by the ranks (default: a TCPStore client of
    MASTER_ADDR:MASTER_PORT); `owner_unlinks`: unlink this rank's segments at close (default: only when no
    prefix was given, i.e. nobody else knows the names)."""

    backend = "shm"

    def __init__(self, rank: int | None = None, world_size: int | None = None, *, store=None,
                 prefix: str | None = None, owner_unlinks: bool | None = None, timeout_s: float | None = None,
                 start_timeout_s: float | None = None, host_store: bool = False):
        rank = comm_settings.launched_int(comm_settings.RANK, rank, "rank")
        world_size = comm_settings.launched_int(comm_settings.WORLD_SIZE, world_size, "world_size")
        span = nodes.span_problem(rank, world_size)
        if span:   # before any segment: peers on another node could never map them
            raise CommError(span, hint=nodes.SPAN_HINT)
        super().__init__(rank, world_size)
        self.timeout_s = comm_settings.timeout_s() if timeout_s is None else float(timeout_s)
        start_s = comm_settings.start_timeout_s() if start_timeout_s is None else float(start_timeout_s)
        base = store_rendezvous.open_store(rank, world_size, store, start_s, host_store)
        self.instance, self.store = store_rendezvous.instance_store(base, rank)
        prefix = prefix or comm_settings.SHM_PREFIX.get() or None
        if prefix is not None:
            check_prefix(prefix)
        self.owner_unlinks = prefix is None if owner_unlinks is None else bool(owner_unlinks)
        self.prefix = prefix or self._agree_prefix(start_s)
        self.base_name = segment_name(self.prefix, f"c{self.instance}")
        self._windows: list[ShmWindow] = []
        self._epoch = 0
        self._closed = False
        self._check = None
        core_each = world_size <= (os.cpu_count() or 1)   # every rank has a core (else: oversubscribed)
        # busy polls pay only while every rank has a core; oversubscribed, a spinner delays the rank it awaits
        self._spin = SPIN_POLLS if core_each else 0
        # futex waits where every rank has a core; oversubscribed, yields and sleeps measured faster (bench/shm_wake.py)
        self._futex = futex.AVAILABLE and comm_settings.shm_block() and core_each
        # oversubscribed, a sleep's overshoot past the signal is on the call's path: shorter longest sleeps (8-rank
        # decode MoE, one job's blocks alternated: 6.28 against 6.63 ms a call with 1 ms, bench/moe_call_cpu.py)
        self._max_sleep = MAX_SLEEP_S if core_each else OVERSUBSCRIBED_MAX_SLEEP_S
        self._poll: PollPolicy | None = None   # None: a fixed poll `_poll_s` (or none)
        self._set_poll(comm_settings.shm_poll_s() if self._futex else 0.0)
        self._init_staging()
        self._ctl = Segment.create(f"{self.base_name}-ctl-r{rank}", CONTROL_SIZE, rank)
        self._ctl.cells64[PID] = os.getpid()
        self._ctl.cells64[STATE] = RUNNING
        # while this communicator owns its segments' names (no launcher unlinks them), exit without close() unlinks
        self._at_exit = self._abort_at_exit() if self.owner_unlinks else None
        try:
            store_rendezvous.start(self.store, rank, world_size, start_s)
            self._peer_ctl = [self._ctl if r == rank else Segment.attach(f"{self.base_name}-ctl-r{r}", rank)
                              for r in range(world_size)]
            self._pids = [c.cells64[PID] for c in self._peer_ctl]
            # no rank unlinks its control segment (leaving early) before every rank has mapped it
            self._barrier("start", None)
        except BaseException as e:
            self.abort(f"{type(e).__name__}: {e}")
            raise
        if comm_settings.comm_check():
            self._check = CollectiveCheck(self.store, rank, world_size, self.timeout_s,
                                          self._watcher(None, "comm_check", None, None))

    def _agree_prefix(self, start_s: float) -> str:
        """No prefix given: rank 0 picks one and the others read it from the store."""
        if self.rank == 0:
            self.store.set("shm_prefix/0", f"pypto-{os.getpid()}-{secrets.token_hex(3)}")
        store_rendezvous.wait_for_ranks(self.store, "shm_prefix", self.rank, 1, start_s, "start")
        return self.store.get("shm_prefix/0").decode()

    # ------------------------------------------------------------------------------------------ signal plumbing
    def _publish(self, cells, index: int, value: int, segment: Segment) -> None:
        """A signal write: after this rank's earlier data writes on every host (see module docstring); then its
        waiters are woken."""
        if _ORDERED_STORES:
            cells[index] = value
        else:
            with segment.locked():
                cells[index] = value
        if self._futex:
            futex.wake(segment.address + index * cells.itemsize)

    def _blocker(self, segment: Segment, cells, index: int):
        """A backoff_wait `block` on `cells[index]` of `segment` (None without futexes): sleeps while the cell
        holds the value it read."""
        if not self._futex:
            return None
        addr = segment.address + index * cells.itemsize
        return lambda seconds: futex.wait(addr, cells[index], seconds)

    def set_poll_us(self, us: int | None) -> None:
        """How long this communicator's futex-backed waits poll before they block, as PYPTO_SHM_POLL_US sets it at
        construction (None: the adaptive policy, a fresh one); for A/B benchmarks inside one job."""
        self._set_poll(None if us is None else int(us) * 1e-6)

    def _set_poll(self, poll_s: float | None) -> None:
        """A fixed poll of `poll_s` seconds before a futex block, or (None) the adaptive policy; no poll without
        futex waits."""
        if self._poll is not None:
            self._poll.close()
        self._poll = PollPolicy(self.world_size) if poll_s is None and self._futex else None
        self._poll_s = 0.0 if poll_s is None or not self._futex else poll_s

    def _poll_budget(self, site):
        """A backoff_wait `poll_s` for a wait at `site`: the fixed PYPTO_SHM_POLL_US, or the policy's, asked lazily."""
        if self._poll is None:
            return self._poll_s
        return lambda: self._poll.budget(site)

    def _waited(self, site, waited: float | None) -> float | None:
        """Tell the poll policy how long a wait at `site` took; returns `waited` (None: it timed out)."""
        if self._poll is not None and waited is not None:
            self._poll.record(site, waited)
        return waited

    def _peer_trouble(self, r: int, barrier: bool) -> str | None:
        """Why rank r can no longer satisfy a wait of this rank, or None."""
        ctl = self._peer_ctl[r]
        state = ctl.cells64[STATE]
        if state == ABORTED:
            why = reason(ctl.cells64, ctl.mm).strip().splitlines()
            return f"rank {r} aborted" + (f" ({why[0]})" if why else "")
        if not alive(self._pids[r]):
            return f"rank {r} died (process {self._pids[r]} exited without closing its communicator)"
        if state == CLOSED and barrier:
            return f"rank {r} closed its communicator (ranks called different numbers of collectives)"
        return None

    def _attach(self, name: str, r: int) -> Segment:
        """Map rank r's segment, which r created before a barrier this rank passed; if it is gone, say whether
        r left (and unlinked it) or someone outside the job removed it."""
        try:
            return Segment.attach(name, self.rank)
        except SegmentMissing:
            trouble = self._peer_trouble(r, barrier=True)
            if trouble is None:
                raise removed_error(name, self.rank, f"this rank cannot map rank {r}'s segment") from None
            raise PeerAbortedError(f"{trouble}, so rank {self.rank} cannot map its segment {name}",
                                   hint="that rank's own error (or exit) is the root cause") from None

    def _watcher(self, peers, op: str, label, record):
        """A `watch` for backoff_wait: raises PeerAbortedError when a rank waited on aborted or died (any of
        `peers`, default all others), or, in a barrier, closed; for a signal when all of them closed."""
        others = [r for r in (range(self.world_size) if peers is None else peers) if r != self.rank]
        barrier = op != "wait"

        def watch():
            troubles = [t for t in (self._peer_trouble(r, barrier) for r in others) if t]
            closed = [r for r in others if self._peer_ctl[r].cells64[STATE] == CLOSED]
            if troubles or (others and len(closed) == len(others)):
                why = troubles[0] if troubles else "every rank that could set it closed its communicator"
                w = record() if record is not None else wait_record(self.rank, op, label, peers=others)
                raise PeerAbortedError(f"{why}, so this wait ends: {describe(w)}",
                                       hint="that rank's own error (or exit) is the root cause", wait=w)
        return watch

    # ------------------------------------------------------------------------------------------ barrier
    def _barrier(self, op: str, label, nbytes: int = -1, call: str | None = None) -> None:
        """Arrive at the next epoch and wait until every peer has; then check that they made the same call
        (`call`: base.signature of it, so op, shape, dtype and scalar arguments; before anyone reads staged data,
        so a mismatch is an error on every rank, never bytes read as another dtype or shape)."""
        self._epoch = e = self._epoch + 1
        call = call or f"{op}()"
        cells = self._ctl.cells64
        post_call(cells, self._ctl.mm, e % 2, op, nbytes, call)
        self._publish(cells, EPOCH, e, self._ctl)
        pending = [r for r in range(self.world_size) if r != self.rank]
        peer_cells = {r: self._peer_ctl[r].cells64 for r in pending}

        def ready():
            while pending and peer_cells[pending[-1]][EPOCH] >= e:
                pending.pop()
            return not pending

        def record(waited):
            return wait_record(self.rank, op, label, seen=[peer_cells[r][EPOCH] for r in sorted(pending)],
                               expected=e, cmp="ge", peers=pending, waited_s=waited)
        def block(seconds):   # on the epoch of the last pending peer (ready pops from the end)
            r = pending[-1]
            futex.wait(self._peer_ctl[r].address + EPOCH * 8, peer_cells[r][EPOCH], seconds)
        start = time.monotonic()
        watch = self._watcher(pending, op, label, lambda: record(time.monotonic() - start))
        if self._waited("barrier", backoff_wait(ready, self.timeout_s, watch, spin=self._spin,
                                                max_sleep=self._max_sleep, block=block if self._futex else None,
                                                poll_s=self._poll_budget("barrier"))) is None:
            raise timeout_error(record(time.monotonic() - start), hint=(
                f"the listed ranks never reached this rank's barrier #{e} (in {op}): they are stuck elsewhere "
                "(see their own reports) or skipped a collective; PYPTO_TIMEOUT_S bounds the wait"))
        mine = cells[CALLS + e % 2]
        for r, c in peer_cells.items():
            if c[CALLS + e % 2] != mine or c[OPS + e % 2] != OP_CODES[op] or c[SIZES + e % 2] != nbytes:
                theirs = call_text(c, self._peer_ctl[r].mm, e % 2)
                raise CollectiveMismatchError(
                    f"rank {self.rank} calls {call} but rank {r} calls {theirs} at the same point (barrier #{e})",
                    hint="every rank must call the same collectives in the same order with the same shapes and "
                         "dtypes")

    def barrier(self, *, label: str | None = None) -> None:
        self._precheck("barrier", "barrier()", label)
        self._barrier("barrier", label)

    def _precheck(self, op: str, sig: str, label) -> None:
        if self._closed:
            raise PyptoError(f"rank {self.rank}: {op} on a closed communicator")
        if self._check is not None:
            self._check(op, sig, label)

    # ------------------------------------------------------------------------------------------ windows
    def alloc_window(self, nbytes: int, name: str | None = None, *, label: str | None = None) -> ShmWindow:
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise PyptoError(f"rank {self.rank}: alloc_window of {nbytes} bytes; a window needs at least 1")
        call = signature("alloc_window", nbytes=nbytes)
        self._precheck("alloc_window", call, label)
        index = len(self._windows)
        own = Segment.create(f"{self.base_name}-w{index}-r{self.rank}", nbytes, self.rank)   # new: all zeros
        # zeroed before any peer can signal into it: peers map it only after this barrier
        self._barrier("alloc_window", label, nbytes, call)
        segments = [own if r == self.rank else self._attach(f"{self.base_name}-w{index}-r{r}", r)
                    for r in range(self.world_size)]
        window = ShmWindow(name or f"w{index}", index, nbytes, segments, self.rank, self)
        self._windows.append(window)
        return window

    def _check_range(self, window: Window, peer: int, byte_offset: int, nbytes: int, op: str) -> None:
        if getattr(window, "owner", None) is not self:
            raise PyptoError(f"rank {self.rank}: {op} on {window!r}, which this communicator did not allocate")
        if self._closed:
            raise PyptoError(f"rank {self.rank}: {op} on a closed communicator")
        check_peer(self, peer, op)
        if byte_offset < 0 or byte_offset + nbytes > window.nbytes:
            raise PyptoError(f"rank {self.rank}: {op} of bytes [{byte_offset}, {byte_offset + nbytes}) is outside "
                             f"window '{window.name}' ({window.nbytes} bytes)")

    def _window_bytes(self, window: Window, peer: int, byte_offset: int, nbytes: int, op: str) -> torch.Tensor:
        self._check_range(window, peer, byte_offset, nbytes, op)
        return window.peer(peer)[byte_offset:byte_offset + nbytes]

    def _cell(self, window: Window, peer: int, byte_offset: int, op: str) -> int:
        self._check_range(window, peer, byte_offset, 4, op)
        if byte_offset % 4:
            raise PyptoError(f"rank {self.rank}: {op} at byte {byte_offset} of window '{window.name}': signal "
                             "cells are int32, so the offset must be a multiple of 4")
        return byte_offset // 4

    def notify(self, window: Window, peer: int, byte_offset: int, value: int, op="atomic_add") -> None:
        op = notify_op(op)
        index = self._cell(window, peer, byte_offset, "notify")
        segment = window.segments[peer]
        cells = segment.cells32
        if op == "set":
            self._publish(cells, index, _wrap32(value), segment)
        else:
            with segment.locked():
                cells[index] = _wrap32(cells[index] + int(value))
            if self._futex:
                futex.wake(segment.address + index * 4)

    def wait(self, window: Window, byte_offset: int, expected: int, cmp="ge", *, label: str | None = None,
             cell: list | None = None, peers: list[int] | None = None) -> int:
        cmp = wait_cmp(cmp)
        index = self._cell(window, self.rank, byte_offset, "wait")
        segment = window.segments[self.rank]
        cells, expected = segment.cells32, int(expected)
        ready = (lambda: cells[index] >= expected) if cmp == "ge" else (lambda: cells[index] == expected)

        def record(waited):
            return wait_record(self.rank, "wait", label, window.name, [index] if cell is None else cell,
                               cells[index], expected, cmp, peers, waited)
        start = time.monotonic()
        watch = self._watcher(peers, "wait", label, lambda: record(time.monotonic() - start))
        site = (window.index, index)
        if self._waited(site, backoff_wait(ready, self.timeout_s, watch, spin=self._spin, max_sleep=self._max_sleep,
                                           block=self._blocker(segment, cells, index),
                                           poll_s=self._poll_budget(site))) is None:
            raise timeout_error(record(time.monotonic() - start))
        return cells[index]

    def remote_load(self, window: Window, peer: int, byte_offset: int, nbytes: int, dtype=torch.uint8,
                    shape=None) -> torch.Tensor:
        out = self._window_bytes(window, peer, byte_offset, int(nbytes), "remote_load").clone()
        out = out.view(dtype)
        return out if shape is None else out.reshape(shape)

    def _typed_target(self, window: Window, peer: int, byte_offset: int, like: torch.Tensor, op: str):
        raw = self._window_bytes(window, peer, byte_offset, like.numel() * like.element_size(), op)
        if byte_offset % like.element_size():
            raise PyptoError(f"rank {self.rank}: {op} of {like.dtype} at byte {byte_offset} of window "
                             f"'{window.name}': the offset must be a multiple of {like.element_size()}")
        return raw.view(like.dtype).view(like.shape)

    def remote_store(self, window: Window, peer: int, byte_offset: int, src: torch.Tensor,
                     atomic_add: bool = False) -> None:
        target = self._typed_target(window, peer, byte_offset, src, "remote_store")
        if atomic_add:
            with window.segments[peer].locked():
                target.add_(src)
        else:
            target.copy_(src)

    def put(self, window: Window, peer: int, byte_offset: int, src: torch.Tensor, atomic_add: bool = False) -> None:
        self.remote_store(window, peer, byte_offset, src, atomic_add)

    def get(self, window: Window, peer: int, byte_offset: int, dst: torch.Tensor) -> torch.Tensor:
        return dst.copy_(self._typed_target(window, peer, byte_offset, dst, "get"))

    # ------------------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Exit barrier (PYPTO_TIMEOUT_S), then CLOSED and release; a failed exit barrier aborts instead."""
        if self._closed:
            return
        try:
            if self._check is not None:
                self._check("close", "close()", None)
            self._barrier("close", None)
        except BaseException as e:
            self.abort(f"{type(e).__name__}: {e}")
            raise
        self._ctl.cells64[STATE] = CLOSED
        self._release()

    def abort(self, why: str = "") -> None:
        """Mark this rank ABORTED (peers' waits on it fail within ~50 ms) and release, without a barrier."""
        if self._closed:
            return
        set_reason(self._ctl.cells64, self._ctl.mm, why)
        self._ctl.cells64[STATE] = ABORTED
        self._release()

    def _release(self) -> None:
        self._closed = True
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
        if self._poll is not None:
            self._poll.close()
        own = [self._ctl] + [w.segments[self.rank] for w in self._windows] + self._own_stages()
        others = [s for w in self._windows for s in w.segments if not s.owned]
        for s in own:
            s.release(unlink=self.owner_unlinks)
        for s in others + self._peer_stage_segments():
            s.release()
