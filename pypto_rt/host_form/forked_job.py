"""The host's side of a host-form job: the rank processes, their store and pipes, joining, the first failure, and
removing the job's segments however it ends (see the package docstring for the whole picture)."""
from __future__ import annotations

import multiprocessing
import os
import secrets
import time
import warnings
from multiprocessing.connection import wait as wait_for_messages

from pypto_rt import config
from pypto_rt.collective import merge_reports, process
from pypto_rt.collective.segments import remove_segments
from pypto_rt.errors import EntryShapeWarning, PyptoError
from pypto_rt.host_form.lifeline import Lifeline
from pypto_rt.host_form.messages import describe_argument, kernel_ref
from pypto_rt.host_form.rank_loop import rank_main

_EXIT_GRACE_S = 10.0     # a rank's exit barrier and process end, after the last dispatch finished
_REPORT_GRACE_S = 2.0    # after a first failure: time for the other ranks' own reports (the merged wait picture)
_BUSY_CPU_S = 0.2        # CPU a rank must have used since its last heartbeat to count as working


class ForkedJob:
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
            proc = ctx.Process(target=rank_main, args=(r, world_size, theirs, binding, inherited, self.lifeline),
                               name=f"pypto-rt rank {r}", daemon=True)
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        # the store's server threads start only after the forks: a child must not inherit a lock one of them holds;
        # it listens on loopback only, its keys under a secret the ranks get through their private pipes
        from pypto_rt.collective import store_rendezvous
        secret = secrets.token_hex(16)
        self.store, _ = store_rendezvous.serve("127.0.0.1", 0, secret)
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
        message = ("run", self.sequence, kernel_ref(kernel, span),
                   [describe_argument(a, self.binding, span) for a in args],
                   {k: describe_argument(v, self.binding, span) for k, v in kwargs.items()})
        self.spans[(rank, self.sequence)] = span
        self.pending[rank] += 1
        self.conns[rank].send(message)
        self._drain()

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
