"""Start rank processes, pump their output, notice the first failure or a signal, and end every rank.

Invariants:
- Each rank leads its own session and process group (pgid == pid): a signal to the group reaches the rank and
  everything it started, and the terminal's Ctrl-C reaches only the launcher, which decides what the ranks get.
- Nothing here waits without a deadline, except `run` waiting for the ranks to finish on their own (the job).
  Every wait is a `select` of at most POLL_S that also wakes on a signal to the launcher.
- Whatever way the job ends, `end` (or `kill_now` on a launcher bug) leaves no process of any rank's group alive.
- A rank's end is timed when the kernel reports it (its pidfd wakes the `select`), not at the next poll: ranks
  that notice a peer's death write error records within ~50 ms, and the report orders failures by these times.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field

from pypto_rt.launch import files
from pypto_rt.launch.output import RankStream

POLL_S = 0.1  # longest sleep between looks at the ranks
REMOTE_POLL_S = 0.5  # how often a multi-node job's launcher asks the store whether another node failed
GRACE_S = 3.0  # SIGTERM -> SIGKILL
REAP_S = 5.0  # SIGKILL -> gone (only a process stuck in the kernel takes longer)
DRAIN_S = 0.5  # output left in pipes once every process is gone
STACK_S = 1.0  # longest wait for the stacks of ranks asked to dump them (faulthandler writes them at once)
STACK_SIGNAL = signal.SIGUSR1  # rank_main's faulthandler dumps every thread's stack to its stack file on it


@dataclass
class RankSpec:
    """How to start one rank: its command, environment and where its output goes."""
    rank: int
    local_rank: int
    argv: list[str]
    env: dict[str, str]
    error_file: str
    echo: bool  # output to the terminal, prefixed
    stdout_log: str | None = None
    stderr_log: str | None = None
    stack_file: str | None = None  # where it dumps its stacks on STACK_SIGNAL


@dataclass
class RankProc:
    """A started rank and what the launcher saw of it (wall-clock times, `time.time()`)."""
    spec: RankSpec
    proc: subprocess.Popen
    ended_at: float | None = None
    signalled: int | None = None  # the last signal the launcher sent its group
    signalled_at: float | None = None  # when the launcher first signalled it
    left_processes: bool = False  # its group outlived it and was ended by the launcher
    pidfd: int | None = None  # readable once it has exited; registered with the selector until then
    stderr: RankStream | None = None  # its stderr as the launcher copied it (with echo), for its tail

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


@dataclass
class Supervisor:
    specs: list[RankSpec]
    watch: object  # SignalWatch: .pending, .fileno(), .drain()
    ranks: list[RankProc] = field(default_factory=list)
    # another node's failure, when the job spans hosts: called about every REMOTE_POLL_S, returns what it said
    remote_failure: object = None
    remote: str | None = None
    # called once with each rank seen to exit while the job runs (the job marks it in the store)
    on_exit: object = None

    def __post_init__(self):
        self._sel = selectors.DefaultSelector()
        if self.watch.fileno() is not None:
            self._sel.register(self.watch.fileno(), selectors.EVENT_READ, None)

    # ---- starting
    def start(self) -> None:
        """Start every rank; raises OSError (after ending those already started) if one cannot start."""
        for spec in self.specs:
            try:
                self.ranks.append(self._start(spec))
            except OSError:
                self.kill_now()
                raise

    def _start(self, spec: RankSpec) -> RankProc:
        outs, streams = [], {}
        for kind, log_path in (("stdout", spec.stdout_log), ("stderr", spec.stderr_log)):
            log = files.create(log_path) if log_path else None
            outs.append((kind, log))
        # with echo the launcher copies pipes to log and terminal; without, the rank writes its log file itself
        pipe_or_log = [subprocess.PIPE if spec.echo else (log or subprocess.DEVNULL) for _, log in outs]
        try:
            proc = subprocess.Popen(spec.argv, env=spec.env, stdin=subprocess.DEVNULL, stdout=pipe_or_log[0],
                                    stderr=pipe_or_log[1], start_new_session=True)
        except OSError:
            for _, log in outs:
                if log:
                    log.close()
            raise
        for (kind, log), pipe in zip(outs, (proc.stdout, proc.stderr)):
            if spec.echo:
                streams[kind] = RankStream(spec.rank, kind, True, log)
                self._sel.register(pipe, selectors.EVENT_READ, (streams[kind], pipe))
            elif log:
                log.close()  # the child holds its own descriptor
        rank = RankProc(spec, proc, stderr=streams.get("stderr"))
        try:
            rank.pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfds (Linux < 5.3): `_poll` times its end, up to POLL_S late
            return rank
        self._sel.register(rank.pidfd, selectors.EVENT_READ, rank)
        return rank

    # ---- watching
    def run(self) -> int | None:
        """Wait until every rank has exited 0 or one has failed (returns None; the return codes say which), or
        until the launcher gets a signal (returns its number)."""
        next_remote, told = 0.0, set()
        while True:
            self._poll()
            for r in self.ranks:
                if r.returncode is not None and r.spec.rank not in told and self.on_exit is not None:
                    told.add(r.spec.rank)
                    self.on_exit(r)
            if self.watch.pending:
                return self.watch.pending[0]
            if any(r.returncode not in (None, 0) for r in self.ranks):
                return None
            if all(r.returncode is not None for r in self.ranks):
                return None
            if self.remote_failure is not None and time.monotonic() >= next_remote:
                next_remote = time.monotonic() + REMOTE_POLL_S
                self.remote = self.remote_failure()
                if self.remote:
                    return None
            self._step(POLL_S)

    def alive(self) -> list[RankProc]:
        return [r for r in self.ranks if r.returncode is None]

    def _poll(self) -> None:
        for r in self.alive():
            if r.proc.poll() is not None:
                r.ended_at = r.ended_at or time.time()

    def _step(self, timeout: float) -> None:
        """Copy whatever output is ready, waiting at most `timeout` (a signal to the launcher or a rank's end
        wakes it)."""
        events = self._sel.select(max(0.0, timeout))
        now = time.time()
        for key, _ in sorted(events, key=lambda e: not isinstance(e[0].data, RankProc)):   # ends first: timed now
            if isinstance(key.data, RankProc):
                self._ended(key.data, now)
                continue
            if key.data is None:
                self.watch.drain()
                continue
            stream, pipe = key.data
            try:
                data = os.read(key.fd, 65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if data:
                stream.feed(data)
            else:
                self._close_stream(key.fileobj, stream, pipe)

    def _ended(self, r: RankProc, now: float) -> None:
        """Rank `r`'s pidfd woke the select: it has exited (reap it) at about `now`."""
        r.ended_at = r.ended_at or now
        r.proc.poll()
        self._close_pidfd(r)

    def _close_pidfd(self, r: RankProc) -> None:
        if r.pidfd is not None:
            if self._sel.get_map() is not None:
                self._sel.unregister(r.pidfd)
            os.close(r.pidfd)
            r.pidfd = None

    def _close_stream(self, fileobj, stream: RankStream, pipe) -> None:
        self._sel.unregister(fileobj)
        stream.close()
        pipe.close()

    def _wait_for_ranks(self, seconds: float) -> bool:
        """Wait up to `seconds` for every rank to end; stops early on a new signal. True when all ended."""
        deadline = time.monotonic() + seconds
        signals = len(self.watch.pending)
        while True:
            self._poll()
            left = deadline - time.monotonic()
            if not self.alive() or left <= 0 or len(self.watch.pending) > signals:
                return not self.alive()
            self._step(min(POLL_S, left))

    # ---- ending
    def end(self, settle_s: float = 0.0, dump_stacks: bool = False) -> None:
        """End the job: let ranks finish for `settle_s`, ask those left for their stacks (`dump_stacks`), then
        SIGTERM each group, SIGKILL after GRACE_S, reap, end any processes the ranks left behind, and copy the
        last output. A signal to the launcher meanwhile skips straight to the next, harder step."""
        if settle_s > 0:
            self._wait_for_ranks(settle_s)
        if dump_stacks:
            self._dump_stacks()
        self._signal_alive(signal.SIGTERM)
        if not self._wait_for_ranks(GRACE_S):
            self._signal_alive(signal.SIGKILL)
            self._wait_for_ranks(REAP_S)
        self._end_left_processes()
        self._drain(DRAIN_S)
        self._close()

    def _dump_stacks(self) -> None:
        """Ask every live rank that handles STACK_SIGNAL (rank_main's faulthandler) to write its stacks, and wait
        up to STACK_S for them. Only the rank process gets it: its own children might die of the signal."""
        asked = [r for r in self.alive() if r.spec.stack_file and _catches(r.proc.pid, STACK_SIGNAL)]
        for r in asked:
            os.kill(r.proc.pid, STACK_SIGNAL)
        deadline = time.monotonic() + STACK_S
        while asked and time.monotonic() < deadline:
            self._step(0.02)
            asked = [r for r in asked if r.returncode is None and not _nonempty(r.spec.stack_file)]
        self._step(0.02)  # a dump just begun gets a moment to finish

    def _close(self) -> None:
        for r in self.ranks:
            self._close_pidfd(r)
        self._sel.close()

    def kill_now(self) -> None:
        """Last resort on a launcher error: SIGKILL every rank's group and reap, without reporting."""
        for r in self.ranks:
            _killpg(r.proc.pid, signal.SIGKILL)
        for r in self.ranks:
            try:
                r.proc.wait(REAP_S)
            except subprocess.TimeoutExpired:
                pass
        self._close()

    def _signal_alive(self, sig: int) -> None:
        for r in self.alive():
            if r.proc.poll() is not None:  # ended on its own just now: not the launcher's doing
                r.ended_at = r.ended_at or time.time()
                continue
            _killpg(r.proc.pid, sig)
            r.signalled = sig
            r.signalled_at = r.signalled_at or time.time()

    def _end_left_processes(self) -> None:
        """Processes a rank started outlive it in its group (its pgid); end them too, TERM then KILL."""
        stray = [r for r in self.ranks if _group_alive(r.proc.pid)]
        for r in stray:
            r.left_processes = True
            _killpg(r.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        signals = len(self.watch.pending)
        while stray and time.monotonic() < deadline and len(self.watch.pending) == signals:
            self._step(POLL_S)
            stray = [r for r in stray if _group_alive(r.proc.pid)]
        for r in stray:
            _killpg(r.proc.pid, signal.SIGKILL)

    def _drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._streams() and time.monotonic() < deadline:
            self._step(min(POLL_S, deadline - time.monotonic()))
        for key in self._streams():  # a pipe still held open by something we could not end
            self._close_stream(key.fileobj, *key.data)

    def _streams(self) -> list:
        return [k for k in self._sel.get_map().values() if isinstance(k.data, tuple)]


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (else the signal might kill it, or do nothing)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next((line.split()[1] for line in f if line.startswith("SigCgt:")), "0")
    except OSError:
        return False
    return bool(int(caught, 16) >> (sig - 1) & 1)


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    """Whether process group `pgid` has a member that is not a zombie (orphans may wait long to be reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False
