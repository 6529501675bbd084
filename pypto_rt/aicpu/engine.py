"""The task-graph engine: the host submits tasks, the engine wires edges, runs ready blocks on the worker pool,
and reports failures, stalls and ring overflows on the host's next call.

Threads: one host (orchestrator) thread calls submit/scope/wait/finish; the tensor map and the scope stack are
touched only by it. Workers run blocks and settle tasks. Every piece of shared state (task states, fanin counts,
consumer lists, ring counters, stats) is guarded by one lock (its runtime's); host waits sleep on `_host_cv`
(same lock) with a deadline, so nothing polls and nothing waits without the stall watchdog. The lock, the condition
and the worker pool belong to the runtime that made the engine (aicpu.resources), not to the module.

Ring: a task holds one of `ring_size` slots from submit until it has finished AND its scope has closed.

Imports only pypto_rt.errors, pypto_rt.config and pypto_rt.run_stats (where a run's figures are noted) from
pypto_rt.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

from pypto_rt import config, run_stats
from pypto_rt.errors import PyptoError

from . import heap, host_watch, resources
from .failures import TaskFailedError, TaskPoisoned, ring_overflow_error, stall_error
from .regions import MemoryRegion
from .scope import RingScope
from .stats import format_stats
from .task import FINISHED, Task
from .tensormap import TensorMap
from .trace import write_trace
from .workers import set_torch_threads

_now = time.perf_counter_ns
_CLOSE_GRACE_S = 2.0
_CORES = os.cpu_count() or 1
_EDGE_STAT = {"RAW": "RAW", "WAW": "WAW", "WAR": "WAR", "dep": "explicit", "order": "atomic_order"}
# raised on the host thread by a signal (Ctrl-C, pypto-run's SIGTERM): it ends the program, not just the block
_INTERRUPTS = (KeyboardInterrupt, SystemExit)


def _positive(what: str, value):
    if value <= 0:
        raise PyptoError(f"{what}={value!r} must be positive")
    return value


class Engine:
    """One run of a task graph. Knobs left None come from PYPTO_NUM_WORKERS / _TIMEOUT_S / _RING_SIZE / _TRACE /
    _STATS; its lock and workers from `home` (default: the calling context's runtime's, `resources.current()`).
    Use as a context manager (exit = close) and call finish() to wait, raise and report."""

    def __init__(self, *, num_workers: int | None = None, timeout_s: float | None = None,
                 ring_size: int | None = None, trace_path: str | None = None, stats: bool | None = None,
                 name: str = "run", inline: bool = False, home: resources.EngineResources | None = None):
        heap.keep_heap_top()
        self._home = home = home or resources.current()
        self._lock, self._host_cv = home.lock, home.host_cv
        self._knobs = config.current_overrides()   # the host's knob overrides, which its workers take on
        self.name = name
        self.inline = inline   # every block runs on the host thread, in submission order, when it next waits
        if num_workers is None:
            num_workers = config.get_int(config.NUM_WORKERS, 1) or _CORES
        self.num_workers = _positive("num_workers", num_workers)
        self.timeout_s = _positive("timeout_s", timeout_s if timeout_s is not None else
                                   config.get_float(config.TIMEOUT_S))
        self.ring_size = _positive("ring_size", ring_size if ring_size is not None else
                                   config.get_int(config.RING_SIZE, 1) or 4096)
        self.trace_path = trace_path if trace_path is not None else config.TRACE.get() or None
        self.print_stats = stats if stats is not None else config.STATS.on()
        self.stats: dict = {}
        self.worker_threads = config.get_int(config.WORKER_THREADS, 1) or 1
        self.host_helps = (config.get_int(config.HOST_INLINE_US, 0) or 0) > 0   # 0: kernels never run on the host
        self._pool = home.pool(self.num_workers, self.worker_threads)
        self._tmap = TensorMap()
        self._scopes = [RingScope(name, None, False)]
        self._live: dict[int, Task] = {}                      # submitted, not yet finished
        self._traced: list[Task] | None = [] if self.trace_path else None
        self._next_id = 0
        self._failure: Task | None = None                     # the first task that failed
        self._closed = self._finished = False
        self._ring_used = self._scope_held = self._ring_high = 0
        self._host_waiting = 0
        self._edges = {"RAW": 0, "WAW": 0, "WAR": 0, "explicit": 0, "atomic_order": 0}
        self._dummies = self._kernel_ns = self._idle_ns = 0
        self.host_reads = 0   # elements of data the host program read (its executor counts them)
        self._t0 = self._last_progress = _now()               # progress = a submit, a block start or end
        self._lane_free = [self._t0] * (self.num_workers + 1)   # the last lane: blocks the host runs itself
        self._deferred: deque = deque()                         # (task, block) the host will run when it waits
        self._queued: deque = deque()                           # (task, block) ready, claimed by no lane yet
        self._running = 0                                       # blocks claimed and not yet done (any lane)
        self.host_stall: PyptoError | None = None               # set by host_watch when it interrupts a block
        self._host = threading.get_ident()
        self._host_threads: int | None = None   # the host's own torch thread count while it runs blocks

    # -- host side ------------------------------------------------------------------------------------------
    def submit(self, name: str, run, accesses=(), *, deps=(), blocks: int = 1, span=None,
               manual: bool = False, order=()) -> Task:
        """Add a task running `run(0..blocks-1)` after its producers: tensor-map edges from `accesses` (none when
        manual or in a manual scope; the accesses still count for host waits) plus explicit `deps` (None entries
        and finished tasks are skipped). `order`: earlier tasks it must follow though no access orders them (in
        manual scopes too; PYPTO_DETERMINISTIC: earlier atomic adds into the same bytes), counted as
        "atomic_order" edges where no other edge joins the two. Blocks while the ring is full."""
        self._check_usable()
        if blocks < 1:
            raise PyptoError(f"task '{name}' has blocks={blocks}; it needs at least one", span)
        accesses = tuple(accesses)
        scope = self._scopes[-1]
        edges = () if manual or scope.manual else self._tmap.edges_for(accesses)
        if order:
            joined = {p for p, _ in edges}
            edges = list(edges) + [(p, "order") for p in dict.fromkeys(order) if p not in joined]
        task = Task(self._next_id, name, run, blocks, accesses, span, _now())
        self._next_id += 1
        with self._lock:
            self._take_slot()
            self._wire(task, edges, deps)
            scope.tasks.append(task)
            self._live[task.id] = task
            self._last_progress = task.t_submit
            if run is None:
                self._dummies += 1
            if task.pending == 0 and not self._dispatch(task):
                self._settle(task)
            elif len(self._live) == 1 and self._deferred:
                # a short kernel with nothing else in flight: the host runs it now rather than at its next wait
                # (nothing can come between: only this thread submits), and its done task needs no map entry
                while self._deferred:
                    self._run_deferred(self._deferred)
        if task.state != "done":
            self._tmap.insert(task, accesses)
        if self._traced is not None:
            self._traced.append(task)
        return task

    def run_now(self, name: str, run, blocks: int = 1, *, span=None) -> Task | None:
        """Host thread, when `runs_at_once` said so for `run`: run the task's blocks here and now, one after
        another, and return it finished (done, or failed: the run then fails as for any task, at the next submit,
        wait or finish). Its producers have all finished (nothing is in flight), so it needs no edges, no map
        entry and no hand-off; it still takes a ring slot in the open scope and counts in the stats. None when a
        trace is being written (which wants every task's full life): then `submit` it."""
        if self._traced is not None:
            return None
        if self._failure is not None or self._closed or self._finished:
            self._check_usable()
        if blocks < 1:
            raise PyptoError(f"task '{name}' has blocks={blocks}; it needs at least one", span)
        # no lock: with nothing in flight no worker touches this engine, and a full ring cannot free a slot
        used = self._ring_used + 1
        if used > self.ring_size:
            raise ring_overflow_error(self._scopes, self.ring_size)
        t0 = _now()
        task = Task(self._next_id, name, run, blocks, (), span, t0)
        self._next_id += 1
        self._ring_used = used
        self._scope_held += 1
        if used > self._ring_high:
            self._ring_high = used
        self._scopes[-1].tasks.append(task)
        if self._host_threads is None:   # a block runs with a worker's thread count on any lane; restored by close
            self._host_threads = set_torch_threads(self.worker_threads)
        lane = self.num_workers
        task.t_ready = task.t_start = t0
        task.lane, task.state = lane, "running"
        error = None
        host_watch.entering(self, task, t0)
        try:
            task.result = run(0)
            for block in range(1, blocks):
                run(block)
        except BaseException as exc:  # a kernel's failure belongs to its task
            error = exc
        host_watch.leaving(self)
        t1 = task.t_end = self._lane_free[lane] = self._last_progress = _now()
        self._kernel_ns += t1 - t0
        task.blocks_left = 0
        if self.host_stall is not None:   # the watchdog interrupted this block: report the stall, not the interrupt
            raise self.host_stall
        self._release(task)
        if error is None:
            task.state = "done"
        else:
            task.state, task.error = "failed", error
            if self._failure is None and not self._closed:
                self._failure = task
            if isinstance(error, _INTERRUPTS):
                raise error
        return task

    def dummy(self, deps=(), *, name: str = "task_dummy", span=None) -> Task:
        """A task that runs nothing and finishes once `deps` have (a dependency-only join)."""
        return self.submit(name, None, deps=deps, span=span, manual=True)

    def idle(self) -> bool:
        """Host thread: no task is in flight (only this thread submits, so none appears until it does)."""
        return not self._live

    def runs_at_once(self, run) -> bool:
        """Host thread: whether a task of `run` submitted now runs before `submit` returns (a short kernel, see
        `host_ok`, with no task in flight), so its accesses need not be worked out for the tensor map."""
        return not self._live and (self.inline or getattr(run, "host_ok", False))

    def wait(self, tasks) -> None:
        """Wait until these tasks (None entries skipped) have finished; raises the run's first failure."""
        pending = [t for t in tasks if t is not None]

        def finished() -> bool:
            while pending and pending[-1].state in FINISHED:
                pending.pop()
            return not pending

        with self._lock:
            self._wait(finished)

    def wait_region(self, region: MemoryRegion, for_write: bool = False) -> None:
        """Host access: wait for the in-flight tasks writing bytes of `region` (and reading them, for_write)."""
        self.wait(self._tmap.in_flight(region, for_write))

    def scope(self, name: str = "scope", span=None, manual: bool = False) -> RingScope:
        """`with engine.scope(...)`: tasks submitted inside belong to this scope and keep their ring slots until it
        closes."""
        return RingScope(name, span, manual, self)

    def finish(self) -> None:
        """Wait for every task; raise the first failure (or a stall); fill `stats`, write the trace, print stats."""
        self._check_open()
        t_finish = _now()
        try:
            with self._lock:
                self._close_scope(self._scopes[0])
                self._wait(lambda: not self._live, help_out=self.host_helps)
        finally:
            self._finished = True
            self._report(t_finish)

    def close(self) -> None:
        """Stop the run (idempotent, also after a failure or stall). Queued blocks are dropped; when a block is
        still running after a short grace, it is asked to stop at its kernel's next Python step and the worker
        pool is abandoned, so a kernel that never returns cannot hold up later runs (see workers.py)."""
        if self._closed:
            return
        self._closed = True
        if self._host_threads is not None:
            set_torch_threads(self._host_threads)
        with self._lock:
            while self._deferred or self._queued:   # never started: dropped
                task, block = (self._deferred or self._queued).popleft()
                self._running += 1
                self._block_done(task, block, self.num_workers, 0, 0,
                                 TaskPoisoned(task, self._failure, dropped=True))
            running = self._let_running_blocks_end(min(_CLOSE_GRACE_S, self.timeout_s))
            # the tensor map's finished tasks hold their arguments; a worker keeps this engine until its next item,
            # and the caller's tensors must not live that long
            self._tmap = TensorMap()
        if running:
            self._home.abandon(self._pool, self)

    def _let_running_blocks_end(self, grace_s: float) -> bool:
        """Lock held. Give blocks already running a short grace to end (a process that exits while a worker is
        inside a torch op can abort in C++ teardown); True when some block is still running after it."""
        deadline = time.monotonic() + grace_s
        self._host_waiting += 1
        try:
            while any(t.state == "running" for t in self._live.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                self._host_cv.wait(left)
            return False
        finally:
            self._host_waiting -= 1

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- host-side helpers (lock held unless noted) ---------------------------------------------------------
    def _check_usable(self) -> None:
        """No lock needed: reads one reference."""
        if self._failure is not None:
            raise TaskFailedError(self._failure)
        self._check_open()

    def _check_open(self) -> None:
        if self._closed or self._finished:
            raise PyptoError(f"run '{self.name}' is already {'closed' if self._closed else 'finished'}")

    def _take_slot(self) -> None:
        """Back-pressure: wait for a free ring slot; raise at once when none can ever free."""
        if self._ring_used >= self.ring_size:
            # slots held only by open scopes free when a scope closes, which this (blocked) host must do itself
            if self._ring_used == self._scope_held:
                raise ring_overflow_error(self._scopes, self.ring_size)
            self._wait(lambda: self._ring_used < self.ring_size)
        self._ring_used += 1
        self._scope_held += 1
        self._ring_high = max(self._ring_high, self._ring_used)

    def _wire(self, task: Task, edges, deps) -> None:
        for producer, kind in edges:
            self._add_edge(task, producer, kind)
        if deps:
            wired = {p for p, _ in edges}
            for producer in deps:
                if producer is not None and producer not in wired:
                    wired.add(producer)
                    self._add_edge(task, producer, "dep")

    def _add_edge(self, task: Task, producer: Task, kind: str) -> None:
        state = producer.state
        if state == "done":
            return
        task.deps.append((producer, kind))
        self._edges[_EDGE_STAT[kind]] += 1
        if state == "failed":
            if task.error is None:
                task.error = TaskPoisoned(task, producer)
        else:
            producer.consumers.append(task)
            task.pending += 1

    def _close_scope(self, scope: RingScope) -> None:
        for task in scope.tasks:
            self._release(task)
        self._scope_held -= len(scope.tasks)
        scope.tasks = []

    def _wait(self, done, help_out: bool = False) -> None:
        """Sleep until done(); raise the first failure, or a StallError after timeout_s without progress.

        `help_out`: the host also runs a queued block no worker has claimed yet when every queued block has an
        idle worker (queued + running <= num_workers; the idle one is still waking up). Concurrency stays within
        num_workers, and a lone task skips the hand-off to a worker and back."""
        self._host_waiting += 1
        try:
            while True:
                if self._failure is not None:
                    raise TaskFailedError(self._failure)
                if done():
                    return
                if self._deferred:
                    self._run_deferred(self._deferred)
                    continue
                if help_out and self._queued and len(self._queued) + self._running <= self.num_workers:
                    self._run_deferred(self._queued)
                    continue
                idle_s = (_now() - self._last_progress) / 1e9
                if idle_s >= self.timeout_s:
                    raise stall_error(self.name, list(self._live.values()), idle_s, _now())
                self._host_cv.wait(self.timeout_s - idle_s)
        finally:
            self._host_waiting -= 1

    def _run_deferred(self, blocks: deque) -> None:
        """Lock held (released meanwhile): the host runs the next of `blocks` on its own lane."""
        task, block = blocks.popleft()
        self._running += 1
        self._lock.release()
        if self._host_threads is None:   # a block runs with a worker's thread count on any lane; restored by close
            self._host_threads = set_torch_threads(self.worker_threads)
        host_watch.entering(self, task)
        try:
            error = self.execute(task, block, self.num_workers)
        finally:
            host_watch.leaving(self)
            self._lock.acquire()
        if self.host_stall is not None:   # the watchdog interrupted this block: report the stall, not the interrupt
            raise self.host_stall
        if isinstance(error, _INTERRUPTS):
            raise error

    def stall_report(self) -> PyptoError:
        """The watchdog's report of this run now (what a host wait raises after timeout_s without progress)."""
        with self._lock:
            live = list(self._live.values())
        return stall_error(self.name, live, (_now() - self._last_progress) / 1e9, _now())

    def _report(self, t_finish: int) -> None:
        """Lock not held."""
        t_end = _now()
        self.stats = {"tasks": self._next_id, "dummy_tasks": self._dummies, "edges": dict(self._edges),
                      "ring_high_water": self._ring_high, "ring_size": self.ring_size, "workers": self.num_workers,
                      "orchestration_ns": t_finish - self._t0, "kernel_ns": self._kernel_ns,
                      "idle_while_ready_ns": self._idle_ns, "wall_ns": t_end - self._t0,
                      "host_reads": self.host_reads}
        if self.trace_path:
            write_trace(self.trace_path, self.name, self._traced, self.num_workers, self._t0)
        run_stats.note_engine(self.name, self.stats)
        if self.print_stats:
            print(format_stats(self.name, self.stats), file=sys.stderr)

    # -- scheduling (lock held unless noted) ----------------------------------------------------------------
    def _dispatch(self, task: Task) -> bool:
        """Queue the blocks of a task whose producers have all finished; False when it must finish without
        running instead (a dummy, a poisoned task, or any task once the run has failed)."""
        task.t_ready = _now()
        if task.error is None and self._failure is not None:
            task.error = TaskPoisoned(task, self._failure, dropped=True)
        if task.error is not None or task.run is None:
            return False
        task.state = "ready"
        if self.inline or getattr(task.run, "host_ok", False) and threading.get_ident() == self._host:
            # a kernel known to be short, made ready by the host itself: the host runs it when it next waits,
            # which saves the two thread hand-offs (tens of µs each) that would dwarf it
            self._deferred.extend((task, block) for block in range(task.blocks))
            return True
        put = self._pool.queue.put
        for block in range(task.blocks):
            self._queued.append((task, block))
            put(self)   # a token: the worker that takes it claims the oldest queued block, if any is left
        return True

    def run_queued(self, lane: int) -> None:
        """Worker thread, lock not held: claim the oldest unclaimed block and run it (the host may have taken
        it already, then there is nothing to do)."""
        config.install(self._knobs)
        with self._lock:
            if not self._queued:
                return
            task, block = self._queued.popleft()
            self._running += 1
        self.execute(task, block, lane)

    def execute(self, task: Task, block: int, lane: int) -> BaseException | None:
        """Worker thread, lock not held: run one block (or drop it once the run has failed or closed); returns
        what the block raised."""
        if self._failure is not None or self._closed:
            with self._lock:
                self._block_done(task, block, lane, 0, 0, TaskPoisoned(task, self._failure, dropped=True))
            return None
        t0 = self._last_progress = _now()
        if block == 0:
            task.lane = lane
        if not task.t_start:
            task.t_start = t0
        task.state = "running"
        error = value = None
        try:
            value = task.run(block)
        except BaseException as exc:  # a kernel's failure belongs to its task, never to the worker
            error = exc
        t1 = _now()
        with self._lock:
            if block == 0:
                task.result = value
            self._block_done(task, block, lane, t0, t1, error)
        return error

    def _block_done(self, task: Task, block: int, lane: int, t0: int, t1: int, error) -> None:
        self._running -= 1
        if t1:
            task.slices.append((block, lane, t0, t1))
            self._kernel_ns += t1 - t0
            self._idle_ns += max(0, t0 - max(self._lane_free[lane], task.t_ready))
            self._lane_free[lane] = self._last_progress = t1
        if error is not None and task.error is None:
            task.error = error
        task.blocks_left -= 1
        if task.blocks_left == 0:
            self._settle(task)

    def _settle(self, task: Task) -> None:
        """Finish `task` and, transitively, consumers that become ready but must not run (dummies, poisoned)."""
        stack = [task]
        while stack:
            t = stack.pop()
            t.t_end = _now()
            if t.error is None:
                t.state = "done"
            else:
                t.state = "failed"
                if self._failure is None and not self._closed:
                    self._failure = t
            self._release(t)
            del self._live[t.id]   # last: a host that finds nothing live may touch the ring without the lock
            for consumer in t.consumers:
                if t.error is not None and consumer.error is None:
                    consumer.error = TaskPoisoned(consumer, t)
                consumer.pending -= 1
                if consumer.pending == 0 and not self._dispatch(consumer):
                    stack.append(consumer)
            t.consumers = ()  # no edge is added to a finished task; this keeps the graph free of cycles
        if self._host_waiting:
            self._host_cv.notify_all()

    def _release(self, task: Task) -> None:
        task.refs -= 1
        if task.refs == 0:
            self._ring_used -= 1
