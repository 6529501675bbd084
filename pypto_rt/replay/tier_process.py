"""The compiled tier's compile process (replay.tier, replay.tier_segments): builds run in a child process, and the
calling process only sends what to trace (replay.tier_request) and loads the compiled code the child left in
inductor's cache.

Why a process (issue 17): make_fx tracing, AOT autograd and inductor's lowering are Python: on a thread of the
calling process they held its interpreter lock for stretches of ~1 s (a priority inversion on a busy machine); a
compile past `tier_timeout_s` could not be stopped; the C++ compiler and OpenMP shared the process. torch's own
`fx_compile_mode=subprocess` moves only inductor's codegen (make_fx and AOT autograd stay in process), has no
timeout and keeps its pool until exit, so the tier runs a small child of its own:

- one long-lived child per process and priority (`python -m pypto_rt.replay.tier_child`), started at its first
  compile, in its own session (a kill reaches the C++ compilers it runs): background compiles go to one at nice 19
  (a busy job keeps the cores), eager ones, which a call waits for, to one at normal priority (at nice 19 on a
  loaded machine they took minutes: the inversion the other way round);
- one request at a time per child; the reply is where inductor wrote the compiled module (the child compiles with
  the FX-graph cache on: replay.tier_inductor.artifact), or why not. A request unanswered at its deadline kills
  the child's process group; the next request starts a fresh child;
- when the process exits (the main thread ends: `threading._register_atexit`, before non-daemon threads are joined;
  and atexit) the children are killed, so exit never waits for a compile and a thread waiting for one reads EOF;
  no child starts afterwards. A child whose parent died exits by itself (replay.tier_child's watch);
- children are started by one long-lived daemon thread of this process (`_Starter`), whichever thread asks: Linux
  sends the parent-death signal when the *thread* that started a child ends, so a child started by a short-lived
  thread (a pool's, a server's request thread) was killed with it, and the next compile paid a fresh start;
- a forked child (a host-form rank) closes its copies of the pipes and forgets the compile children (never kills
  them); its first compile starts its own.
"""
from __future__ import annotations

import atexit
import io
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

import torch

from pypto_rt.replay import tier_request

IDLE_NICE = 19         # the background compile process's nice value (read when one starts)
START_WAIT_S = 120.0   # a child that has not said it is ready after this is killed (loading torch takes seconds)
cache = [0, 0]         # graphs the children found in inductor's FX-graph cache (loaded from disk), and did not


class CompileFailed(Exception):
    """The child's build raised (the message: `Type: first line` of what it raised), or the child ended."""


class TimedOut(Exception):
    """No answer before the deadline: the child was killed."""


def compile_apart(body, constants: tuple | None, examples: list, values: tuple, threads: int, prepare: tuple,
                  deadline: float, idle: bool, dynamic: dict | None = None) -> tuple:
    """replay.tier_inductor.build's results for `body` (with replay.tier_graph.with_constants(body, *constants)
    where given), built in the child of `idle` priority before `deadline`: inductor's `call` loaded here from its
    cache where the graph allows, the check of the carried values' assumptions, what `prepare` gave; compile_fx's
    wrapped function is built here at its first call only (from inductor's cache, where the child stored it: needed
    where the direct call does not serve). `prepare`: (`module:function`, leading arguments) run on the traced
    graph; `dynamic`: example index -> its dims traced as symbolic sizes (replay.tier_family), in both builds."""
    from pypto_rt.replay import tier_inductor
    from pypto_rt.replay.tier_graph import with_constants

    made = build(tier_request.request(body, constants, examples, values, threads, prepare, dynamic), deadline, idle)
    fn = with_constants(body, *constants) if constants else body
    wrapped = _Wrapped(lambda: tier_inductor.build(fn, examples, values, threads, tier_request.preparer(prepare),
                                                   dynamic, made["changes"])[0])
    direct = tier_inductor.load(made["module"], threads, made["changes"]) if made["module"] else None
    assumed = tier_inductor.assumptions(made["assumptions"], len(examples) + len(values))
    return wrapped, direct, assumed, made["prepared"]


class _Wrapped:
    """compile_fx's wrapped function, built in this process at its first call (once, whichever thread calls)."""

    def __init__(self, make):
        self.make, self.fn, self.lock = make, None, threading.Lock()

    def __call__(self, *inputs):
        if self.fn is None:
            with self.lock:
                if self.fn is None:
                    self.fn = self.make()
        return self.fn(*inputs)


class _Child:
    """A running compile child: its process and the two pipe ends this process holds."""

    def __init__(self, nice: int):
        from_parent, to_child = os.pipe()   # (read end, write end)
        from_child, to_parent = os.pipe()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)   # (this process's environment, its import path first)
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pypto_rt.replay.tier_child", str(from_parent), str(to_parent), str(nice),
                 str(os.getpid())],
                pass_fds=(from_parent, to_parent), start_new_session=True, env=env, stdin=subprocess.DEVNULL)
        except BaseException:
            for fd in (to_child, from_child):
                os.close(fd)
            raise
        finally:
            os.close(from_parent)
            os.close(to_parent)
        self.requests, self.replies = Connection(to_child, readable=False), Connection(from_child, writable=False)

    def kill(self) -> None:
        """Kill the child and what it started; its pipes stay open for a thread reading them (it reads EOF)."""
        if self.process.poll() is not None:   # (reaped: its number may be another's now)
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)   # (its session: the C++ compilers it started too)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            pass

    def forget(self) -> None:
        """Close this process's pipe ends (a forked process's copies too: they would keep the child's input open)."""
        self.requests.close()
        self.replies.close()


class _Starter:
    """Starts the compile children on its own daemon thread, alive as long as this process (see the module text);
    a caller waits for the start at most START_WAIT_S. A start its caller gave up on is killed."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread, self.lock = None, threading.Lock()

    def start(self, nice: int) -> _Child:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="pypto-rt-tier-starter", daemon=True)
                self.thread.start()
        done: queue.SimpleQueue = queue.SimpleQueue()
        abandoned, handoff = threading.Event(), threading.Lock()
        self.jobs.put((nice, done, abandoned, handoff))
        try:
            kind, value = done.get(timeout=START_WAIT_S)
        except queue.Empty:
            with handoff:   # (a child handed over before the flag was set is this side's to kill)
                abandoned.set()
                late = None if done.empty() else done.get_nowait()
            if late is not None and late[0] == "child":
                _discard(late[1])
            raise CompileFailed(f"the compile process was not started within {START_WAIT_S:g} s") from None
        if kind == "error":
            raise value
        return value

    def _run(self) -> None:
        while True:
            nice, done, abandoned, handoff = self.jobs.get()
            try:
                child = _Child(nice)
            except BaseException as e:   # noqa: BLE001 - goes to the caller
                done.put(("error", e))
                continue
            with handoff:   # (exactly one side owns the child: the caller, or nobody and it is killed here)
                if not abandoned.is_set():
                    done.put(("child", child))
                    continue
            _discard(child)


def _discard(child: _Child) -> None:
    """A started child whose caller gave up waiting: never left running."""
    child.kill()
    child.forget()


_starter = _Starter()


class _Slot:
    """The child of one priority (`idle`: background compiles), while one runs; one request at a time."""

    def __init__(self, idle: bool):
        self.idle, self.child, self.lock = idle, None, threading.Lock()
        # (until the child says how it runs)
        self.priority = f"at idle priority, nice {IDLE_NICE}" if idle else "at normal priority"


_slots = {True: _Slot(True), False: _Slot(False)}
_closing = False   # the process is exiting: no child starts


def priority(idle: bool) -> str:
    """How the compile child for background (`idle`) or eager compiles runs."""
    return _slots[idle].priority


def build(request: dict, deadline: float, idle: bool) -> dict:
    """Send `request` (replay.tier_request) to the child of that priority and return its artifact
    (replay.tier_inductor.artifact); raises CompileFailed, tier_source.Untierable (the build refused the graph), or
    TimedOut once `deadline` (time.perf_counter) passes: the child is then killed."""
    payload = io.BytesIO()
    torch.save(request, payload)
    slot = _slots[idle]
    if not slot.lock.acquire(timeout=max(0.0, min(deadline - time.perf_counter(), threading.TIMEOUT_MAX))):
        raise TimedOut("waiting for another compile")
    try:
        child = _running(slot, deadline)
        try:
            child.requests.send_bytes(payload.getbuffer())
        except OSError as e:   # (killed at exit meanwhile)
            _stop(slot)
            raise CompileFailed(f"the compile process ended ({e})") from None
        kind, value = _answer(slot, deadline)
    finally:
        slot.lock.release()
    if kind == "kept":
        from pypto_rt.replay.tier_source import Untierable

        raise Untierable(value)
    if kind == "failed":
        raise CompileFailed(value)
    cache[0], cache[1] = cache[0] + value["cache"][0], cache[1] + value["cache"][1]
    return value


def _running(slot: _Slot, deadline: float) -> _Child:
    """The slot's child, started if none runs (its `ready` reply read within the deadline)."""
    if slot.child is not None and slot.child.process.poll() is None:
        return slot.child
    _stop(slot)   # (one that ended: with the thread that started it, see replay.tier_child)
    _register_exit()
    if _closing:
        raise CompileFailed("the process is exiting: no compile starts")
    slot.child = _starter.start(IDLE_NICE if slot.idle else 0)
    _, slot.priority = _answer(slot, min(deadline, time.perf_counter() + START_WAIT_S))
    return slot.child


def _answer(slot: _Slot, deadline: float):
    """The child's next reply; TimedOut (the child killed) past `deadline`, CompileFailed if it ended."""
    child = slot.child
    if child is None:
        raise CompileFailed("the compile process ended (the process is exiting)")
    if not child.replies.poll(min(max(0.0, deadline - time.perf_counter()), 1e6)):
        _stop(slot)
        raise TimedOut("the compile was stopped")
    try:
        return pickle.loads(child.replies.recv_bytes())
    except (EOFError, OSError):
        code = child.process.poll()
        _stop(slot)
        raise CompileFailed(f"the compile process ended (exit status {code})") from None


def _stop(slot: _Slot) -> None:
    """Kill the slot's child and close its pipes (the caller holds the slot's lock); the next request starts a
    fresh child."""
    child, slot.child = slot.child, None
    if child is not None:
        child.kill()
        child.forget()


_registered: list = []


def _register_exit() -> None:
    """Kill the children when the main thread ends (before non-daemon threads are joined) and at exit."""
    if _registered:
        return
    _registered.append(True)
    atexit.register(_close)
    try:
        threading._register_atexit(_close)
    except RuntimeError:   # (already shutting down)
        _close()


def _close() -> None:
    """Exit: kill the children; a thread waiting for one reads EOF and cleans up."""
    global _closing
    _closing = True
    for slot in _slots.values():
        if slot.child is not None:
            slot.child.kill()


def _forget_after_fork() -> None:
    """In a forked process: close the copies of the pipes, forget the parent's compile children (never kill them)
    and its starter thread (not copied by fork: the first compile here starts its own)."""
    global _slots, _closing, _starter
    for slot in _slots.values():
        if slot.child is not None:
            slot.child.forget()
    _slots, _closing, _starter = {True: _Slot(True), False: _Slot(False)}, False, _Starter()
    _registered.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
