"""A host-form rank process (forked by the host's ForkedJob): serve the host's requests until it says exit,
or until the host is gone."""
from __future__ import annotations

import gc
import os
import sys
import threading
import time
import warnings

from pypto_rt import config
from pypto_rt.collective import process
from pypto_rt.errors import EntryShapeWarning
from pypto_rt.host_form.messages import failure_report, rebuild_argument, resolve_kernel

_HEARTBEAT_S = 5.0       # a rank says how much CPU it has used this often


def rank_main(rank: int, world_size: int, conn, binding, inherited, lifeline) -> None:
    """The rank's whole life: join the job's store and shm communicator, then answer messages (see messages)."""
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

        from pypto_rt.collective import create_communicator, store_rendezvous
        _, port, secret = conn.recv()   # ("store", port, secret): the host starts its store after forking every rank
        store = store_rendezvous.join(TCPStore("127.0.0.1", port, is_master=False), secret, f"127.0.0.1:{port}",
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
            (send or conn.send)(("error", failure_report(e, failed_at)))
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
    _, sequence, ref, args, kwargs = message
    try:
        target = resolve_kernel(ref)
        with warnings.catch_warnings(record=True) as caught:   # shape warnings go to the host (its dispatch line)
            warnings.simplefilter("always", EntryShapeWarning)
            target(*[rebuild_argument(a, binding) for a in args],
                   **{k: rebuild_argument(v, binding) for k, v in kwargs.items()})
    except BaseException as e:   # noqa: BLE001 - reported to the host, which ends the job
        failed_at = time.time()   # before the abort, so every peer that fails because of it fails later
        process.abort(f"{type(e).__name__}: {e}")
        return ("error", failure_report(e, failed_at))
    for w in caught:   # the others, as they would have appeared
        if not issubclass(w.category, EntryShapeWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return ("done", sequence, [str(w.message) for w in caught if issubclass(w.category, EntryShapeWarning)])
