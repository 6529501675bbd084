"""The host form of a multi-rank program: a `@pl.jit.host` function runs in this process and dispatches chip
programs with `device=r` to one rank process per device id, which this runtime starts itself.

    host process                                   rank process r (forked; one per device id)
    ------------                                   ----------------------------------------------
    share the entry's tensors (share_memory_)      shm communicator (rank r of n), installed as
    fork the ranks, host their TCPStore            this process's communicator
    run the host body (ReferenceExecutor):
      pld.alloc_window_buffer -> "alloc" to all    -> a collective alloc_window, acknowledged
      f(..., device=r)        -> "run" to rank r   -> f(*args) on this process's runtime, then
                                                      "done" (with its EntryShapeWarnings, which the host
                                                      gives at the dispatch line), or "error" with the
                                                      rendered error
    the body's end joins every dispatch            "exit": an exit barrier, then the process ends
    remove /dev/shm/<prefix>+* (this process owns the job's segments, also on failure)

Dispatches are asynchronous; the function's end joins all ranks (DESIGN.md "Host form"). Tensors reach the
ranks as views of the entry's tensors, whose storage was moved to shared memory in place before the fork, so
the ranks' writes land in the caller's tensors. A rank that fails aborts its communicator (peers waiting on it
fail at once); the host reports the first failure, with every rank's wait report merged. If this process dies
without ending the job (SIGKILL), its ranks end at once and the last one out removes the segments (host_lifeline).
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import secrets
import sys
import threading
import time
import traceback
import warnings
from multiprocessing.connection import wait as wait_for_messages

from pypto_rt import config
from pypto_rt.aicpu.failures import StallError
from pypto_rt.collective import merge_reports, process
from pypto_rt.collective.base import CommTimeoutError
from pypto_rt.collective.segments import remove_segments
from pypto_rt.errors import EntryShapeWarning, NotSupportedError, PyptoError, error_chain, find_wait, user_span
from pypto_rt.language._runtime import activate
from pypto_rt.ops.value import TensorValue
from pypto_rt.orchestration.host_lifeline import Lifeline
from pypto_rt.reference.executor import ReferenceExecutor

_EXIT_GRACE_S = 10.0     # a rank's exit barrier and process end, after the last dispatch finished
_REPORT_GRACE_S = 2.0    # after a first failure: time for the other ranks' own reports (the merged wait picture)
_HEARTBEAT_S = 5.0       # a rank says how much CPU it has used this often
_BUSY_CPU_S = 0.2        # CPU a rank must have used since its last heartbeat to count as working


def device_ids() -> list[int]:
    text = config.DEVICE_IDS.get().strip()
    try:
        ids = [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        ids = []
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise PyptoError(f"PYPTO_DEVICE_IDS={text!r} must list distinct non-negative device ids, e.g. 0,1,2,3")
    return ids


def run_host(kernel, binding):
    """Run a @pl.jit.host entry: its body here, its `device=r` dispatches on rank processes."""
    if not hasattr(os, "fork"):
        raise NotSupportedError("host-form programs start their rank processes with fork(), which this platform "
                                "lacks", None, "run the ranks with pypto-launch --nproc N instead")
    for value in binding.values:   # the ranks write into these: shared memory, moved in place before the fork
        if isinstance(value, TensorValue):
            value.data.share_memory_()
    job = _Job(len(device_ids()), binding)
    try:
        executor = _HostFormExecutor(binding, job)
        process.set_host_form(job)
        try:
            with activate(executor):
                result = executor.run_entry(kernel)
        finally:
            process.set_host_form(None)
        job.join()
    except BaseException:
        job.kill()
        raise
    finally:
        job.close()
    return result


class _HostFormExecutor(ReferenceExecutor):
    """The host body runs eagerly, as on the reference executor; `f(..., device=r)` becomes a dispatch."""

    def __init__(self, binding, job):
        super().__init__(binding)
        self.job = job

    def call_kernel(self, kernel, args, kwargs):
        if "device" not in kwargs:
            return super().call_kernel(kernel, args, kwargs)
        kwargs = dict(kwargs)
        rank = int(kwargs.pop("device"))
        self.job.dispatch(rank, kernel, args, kwargs, user_span())
        return None


class _Job:
    """The rank processes of one host-form call, their store, pipes and segments."""

    def __init__(self, world_size: int, binding):
        self.world_size = world_size
        self.binding = binding
        self.prefix = f"pypto-{os.getpid()}-{secrets.token_hex(3)}"
        self.store = None
        self.timeout_s = config.get_float(config.TIMEOUT_S)
        self.windows = 0
        self.pending = [0] * world_size      # dispatches sent to each rank and not finished
        self.acks = [0] * world_size         # window allocations not yet acknowledged
        self.cpu = [0.0] * world_size        # each rank's CPU seconds at its last heartbeat that showed work
        self.spans: dict[tuple[int, int], object] = {}
        self.warned: set[str] = set()        # EntryShapeWarnings the ranks sent, given once each
        self.failures: list[dict] = []
        self.sequence = 0
        ctx = multiprocessing.get_context("fork")
        self.lifeline = Lifeline(self.prefix)   # the ranks end, and clean up, when this process ends in any way
        self.conns, self.procs = [], []
        for r in range(world_size):
            mine, theirs = ctx.Pipe()
            inherited = self.conns + [mine, self.lifeline.host_end]   # host ends a fork copies into the child
            proc = ctx.Process(target=_rank_main, args=(r, world_size, theirs, binding, inherited, self.lifeline),
                               name=f"pypto-rt rank {r}", daemon=True)
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        # the store's server threads start only after the forks: a child must not inherit a lock one of them holds;
        # it listens on loopback only, its keys under a secret the ranks get through their private pipes
        from pypto_rt.collective import rendezvous
        secret = secrets.token_hex(16)
        self.store, _ = rendezvous.serve("127.0.0.1", 0, secret)
        for conn in self.conns:
            conn.send(("store", self.store.port, secret))

    # -- the host body's requests ----------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> process.HostWindowBuffer:
        """COLLECTIVE on every rank: the next window buffer, acknowledged by all before the body goes on."""
        buf = process.HostWindowBuffer(self.windows, nbytes)
        self.windows += 1
        for r, conn in enumerate(self.conns):
            self.acks[r] += 1
            conn.send(("alloc", nbytes))
        self._collect(lambda: not any(self.acks))
        return buf

    def dispatch(self, rank: int, kernel, args, kwargs, span) -> None:
        if not 0 <= rank < self.world_size:
            raise PyptoError(f"device={rank} is outside this host program's {self.world_size} devices", span,
                             "set DistributedConfig(device_ids=[...]) with one id per rank")
        self.sequence += 1
        message = ("run", self.sequence, _kernel_ref(kernel, span), [self._describe(a, span) for a in args],
                   {k: self._describe(v, span) for k, v in kwargs.items()})
        self.spans[(rank, self.sequence)] = span
        self.pending[rank] += 1
        self.conns[rank].send(message)
        self._drain()

    def _describe(self, value, span):
        """How a rank rebuilds an argument: a view of an entry tensor, a window view, or the value itself."""
        if isinstance(value, TensorValue):
            value = value.data
        if isinstance(value, process.HostWindowView):
            return ("window", value.buffer.index, value.shape, value.dtype)
        if hasattr(value, "untyped_storage"):
            ptr = value.untyped_storage().data_ptr()
            for index, base in enumerate(self.binding.values):
                if isinstance(base, TensorValue) and base.data.untyped_storage().data_ptr() == ptr:
                    return ("tensor", index, value.storage_offset(), tuple(value.shape), tuple(value.stride()))
            raise NotSupportedError("a device= dispatch can pass the host program's own tensor parameters (and "
                                    "views of them), windows and scalars; this tensor was made in the host body",
                                    span, "pass it in as a parameter of the @pl.jit.host function")
        return ("value", value)

    # -- joining -----------------------------------------------------------------------------------------------
    def join(self) -> None:
        """Wait until every dispatch has finished; raise the first failure."""
        self._collect(lambda: not any(self.pending))

    def _drain(self) -> None:
        """Take replies already there (a failure is reported at once, not at the end)."""
        self._collect(lambda: True, poll_only=True)

    def _collect(self, done, poll_only: bool = False) -> None:
        last = time.monotonic()
        while not done() or poll_only:
            ready = wait_for_messages(self.conns, timeout=0 if poll_only else 0.5)
            if poll_only and not ready:
                break
            for conn in ready:
                if self._receive(self.conns.index(conn)):
                    last = time.monotonic()
            if self.failures:
                self._fail()
            if not ready:
                self._check_alive(last)
            if poll_only:
                break

    def _receive(self, rank: int) -> bool:
        """Take one message from `rank`; True when it shows progress (a heartbeat only when the rank's CPU
        time grew: a rank stuck without working, e.g. in a deadlocked C call, must not look alive)."""
        try:
            message = self.conns[rank].recv()
        except EOFError:
            self._lost(rank)
            return True
        kind = message[0]
        if kind == "alive":
            busy = message[1] > self.cpu[rank] + _BUSY_CPU_S
            self.cpu[rank] = max(self.cpu[rank], message[1]) if busy else self.cpu[rank]
            return busy
        if kind == "ok":
            self.acks[rank] -= 1
        elif kind == "done":
            self.pending[rank] -= 1
            self._shape_warnings(self.spans.get((rank, message[1])), message[2])
        elif kind == "error":
            self.pending[rank] -= 1
            self.failures.append(dict(message[1], rank=rank))
        return True

    def _shape_warnings(self, span, texts) -> None:
        """A dispatched kernel's EntryShapeWarnings, given at the dispatch line, once per text over all ranks."""
        for text in texts:
            if text not in self.warned:
                self.warned.add(text)
                warnings.warn_explicit(text, EntryShapeWarning, span.file if span else "<host>", span.line if span
                                       else 0)

    def _lost(self, rank: int) -> None:
        code = self.procs[rank].exitcode
        self.procs[rank].join(1)
        code = self.procs[rank].exitcode if code is None else code
        how = f"exit code {code}" if code is None or code >= 0 else f"signal {-code}"
        self.failures.append({"rank": rank, "time": time.time(), "wait": None,
                              "message": f"rank {rank}'s process ended unexpectedly ({how})"})

    def _check_alive(self, last_progress: float) -> None:
        for r, proc in enumerate(self.procs):
            if not proc.is_alive() and (self.pending[r] or self.acks[r]):
                self._lost(r)
        if self.failures:
            self._fail()
        if time.monotonic() - last_progress > self.timeout_s + 30:
            busy = [r for r in range(self.world_size) if self.pending[r]]
            raise PyptoError(f"host-form program: ranks {busy} did no work and reported nothing for "
                             f"{self.timeout_s + 30:.0f} s (their own waits end after PYPTO_TIMEOUT_S, so something "
                             "outside them is stuck)", None, "run with PYPTO_EXECUTOR=reference, or look at the ranks "
                             "with py-spy dump --pid <rank pid>")

    def _fail(self) -> None:
        """Gather the other ranks' reports briefly, then raise the first failure with the merged wait picture."""
        deadline = time.monotonic() + _REPORT_GRACE_S
        while time.monotonic() < deadline and len({f["rank"] for f in self.failures}) < self.world_size:
            for conn in wait_for_messages(self.conns, timeout=0.1):
                self._receive(self.conns.index(conn))
        first = min(self.failures, key=lambda f: f["time"])
        others = sorted({f["rank"] for f in self.failures} - {first["rank"]})
        message = first["message"][len("error: "):] if first["message"].startswith("error: ") else first["message"]
        lines = [f"rank {first['rank']} failed first: {message}"]
        if others:
            lines.append(f"ranks {others} failed after it")
        waits = [f["wait"] for f in self.failures if f.get("wait")]
        if waits:
            lines += ["", merge_reports(waits, self.world_size)]
        # the hint is about waits only when one is the root cause: peers of a rank that raised fail their waits too
        hint = ("a wait nobody satisfies: check that every rank notifies the cells its peers wait for, with the "
                "values they expect" if first.get("stalled") else None)
        raise PyptoError("\n".join(lines), None, hint)

    # -- teardown ----------------------------------------------------------------------------------------------
    def kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()

    def close(self) -> None:
        """End the ranks (an exit barrier when healthy), then remove every segment of the job, also when a signal
        (SIGTERM, Ctrl-C) interrupts the ending: the ranks may be gone by then, leaving nobody else to remove them."""
        try:
            for conn in self.conns:
                try:
                    conn.send(("exit",))
                except (BrokenPipeError, OSError):
                    pass
            deadline = time.monotonic() + _EXIT_GRACE_S
            for proc in self.procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        finally:
            self.kill()
            for proc in self.procs:
                proc.join(1)
            for conn in self.conns:
                conn.close()
            remove_segments(self.prefix)
            self.lifeline.close()
            self.store = None


def _kernel_ref(kernel, span):
    module = getattr(kernel.fn, "__module__", None)
    if module not in sys.modules:
        raise NotSupportedError(f"cannot dispatch {kernel.name}: its module is not importable", span)
    return module, kernel.fn.__qualname__


# ------------------------------------------------------------------------------------- the rank processes

def _rank_main(rank: int, world_size: int, conn, binding, inherited, lifeline) -> None:
    """A rank process (forked): serve the host's requests until it says exit, or until the host is gone."""
    # the host's objects are never collected here: a C++ one among its garbage (a store, a process group) would
    # join a thread this process does not have in its destructor and abort the rank (std::system_error)
    gc.freeze()
    for host_end in inherited:   # else this process itself keeps its pipes open, and a dead host is never seen
        host_end.close()
    watch = lifeline.watch()   # before this rank creates any segment
    prefix = lifeline.prefix
    _one_torch_thread()
    code, send = 0, None
    try:
        from torch.distributed import TCPStore

        from pypto_rt.collective import create_communicator, rendezvous
        _, port, secret = conn.recv()   # ("store", port, secret): the host starts its store after forking every rank
        store = rendezvous.join(TCPStore("127.0.0.1", port, is_master=False), secret, f"127.0.0.1:{port}",
                                f"rank {rank}")
        process.install(create_communicator("shm", rank, world_size, store=store, prefix=prefix,
                                            owner_unlinks=False))
        send = _Sender(conn)
        while True:
            message = conn.recv()
            if message[0] == "exit":
                break
            if message[0] == "alloc":
                process.alloc(message[1], "pld.alloc_window_buffer")
                send(("ok",))
            elif message[0] == "run":
                send(_run_dispatch(message, binding))
        send.stop()
        process.close()
    except BaseException as e:   # noqa: BLE001 - a rank reports any failure and ends
        if isinstance(e, (EOFError, BrokenPipeError, ConnectionResetError)):
            watch.leave()   # the host process is gone without ending the job
        failed_at = time.time()
        process.abort(f"{type(e).__name__}: {e}")
        try:
            (send or conn.send)(("error", _report(e, failed_at)))
        except (BrokenPipeError, OSError):
            pass
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)   # no atexit handlers or finalizers of the parent's objects run in a forked child


class _Sender:
    """A rank's messages to the host, plus a heartbeat thread that sends its CPU time every _HEARTBEAT_S."""

    def __init__(self, conn):
        self.conn, self.lock, self.stopped = conn, threading.Lock(), threading.Event()
        threading.Thread(target=self._beat, name="pypto-rt rank heartbeat", daemon=True).start()

    def __call__(self, message) -> None:
        with self.lock:
            self.conn.send(message)

    def _beat(self) -> None:
        while not self.stopped.wait(_HEARTBEAT_S):
            try:
                self(("alive", time.process_time()))
            except OSError:
                return

    def stop(self) -> None:
        self.stopped.set()


def _one_torch_thread() -> None:
    """A forked rank runs torch single-threaded, on every thread: the host's OpenMP team (used before the fork,
    e.g. by the golden) does not exist here, and the first parallel region would wait for it forever. One rank
    per device is the parallelism; PYPTO_WORKER_THREADS is overridden to 1 in ranks."""
    import torch
    torch.set_num_threads(1)
    os.environ[config.WORKER_THREADS.env] = "1"
    config.drop_override(config.WORKER_THREADS)


def _run_dispatch(message, binding):
    _, sequence, (module, qualname), args, kwargs = message
    try:
        target = sys.modules[module]
        for part in qualname.split("."):
            target = getattr(target, part)
        with warnings.catch_warnings(record=True) as caught:   # shape warnings go to the host (its dispatch line)
            warnings.simplefilter("always", EntryShapeWarning)
            target(*[_rebuild(a, binding) for a in args], **{k: _rebuild(v, binding) for k, v in kwargs.items()})
    except BaseException as e:   # noqa: BLE001 - reported to the host, which ends the job
        failed_at = time.time()   # before the abort, so every peer that fails because of it fails later
        process.abort(f"{type(e).__name__}: {e}")
        return ("error", _report(e, failed_at))
    for w in caught:   # the others, as they would have appeared
        if not issubclass(w.category, EntryShapeWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return ("done", sequence, [str(w.message) for w in caught if issubclass(w.category, EntryShapeWarning)])


def _rebuild(described, binding):
    kind = described[0]
    if kind == "value":
        return described[1]
    if kind == "tensor":
        _, index, offset, shape, stride = described
        return binding.values[index].data.as_strided(shape, stride, offset)
    _, index, shape, dtype = described
    from pypto_rt.language.distributed import window
    return window(process.local_buffers()[index], shape, dtype)


def _report(error: BaseException, failed_at: float) -> dict:
    """The rendered error (user frames only), when it happened (the host orders failures by it, not by arrival),
    the first wait report found in its chain, and whether the error is a stall (a wait past its deadline, an
    engine without progress) rather than an exception user code raised."""
    from pypto_rt.errors import strip_internal_frames
    render = getattr(error, "render", None)
    if render is not None:
        text = render()
    else:
        text = "".join(traceback.format_exception(type(error), error, strip_internal_frames(error.__traceback__)))
    return {"message": text.rstrip(), "time": failed_at, "wait": find_wait(error), "stalled": _stalled(error)}


def _stalled(error: BaseException) -> bool:
    """Whether `error`'s chain holds a timed-out wait or an engine stall."""
    return any(isinstance(e, (CommTimeoutError, StallError)) for e in error_chain(error))
