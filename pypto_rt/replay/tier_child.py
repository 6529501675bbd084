"""The compiled tier's compile child (replay.tier_process starts it: `python -m pypto_rt.replay.tier_child IN OUT
NICE PARENT`: the file descriptors of its requests and replies, its nice value, its parent's process id).

It loads torch and inductor, then lowers its own CPU priority to NICE (what it starts, the C++ compilers, inherits
it; loading first, at normal priority, takes seconds of CPU once, where at nice 19 on a loaded machine the first
compile waited minutes for it), says it is ready,
then answers requests one at a time: each one traced and compiled by replay.tier_inductor.artifact, the compiled
code left in inductor's cache for the parent to load. Replies: ("ready", priority), ("ok", artifact),
("kept", why) (the build refused the graph: replay.tier_source.Untierable), ("failed", "Type: first line").
It exits at the end of its input, and is killed by the kernel when the thread of its parent that started it ends
(Linux's parent-death signal: replay.tier_process starts children from one daemon thread that lives as long as
the process, so this is the parent process's end; elsewhere a watch thread polls for the parent, which needs the
interpreter lock that the compile, at idle priority, may hold for long), so a killed parent leaves no compile
running.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
import threading
import time
from multiprocessing.connection import Connection


def main(requests_fd: int, replies_fd: int, nice: int, parent: int) -> None:
    os.dup2(2, 1)   # (prints of what it runs go to stderr, never into the replies)
    _end_with_parent(parent)
    requests, replies = Connection(requests_fd, writable=False), Connection(replies_fd, readable=False)
    import torch
    import torch._inductor.compile_fx  # noqa: F401 - loaded before lowering the priority (see the module text)

    torch.set_num_threads(1)   # (compiling needs one; the parent runs the compiled code)
    priority = _lower_priority(nice) if nice else "at normal priority"
    replies.send_bytes(pickle.dumps(("ready", priority)))
    while True:
        try:
            data = requests.recv_bytes()
        except EOFError:
            return
        replies.send_bytes(pickle.dumps(_serve(data)))


def _serve(data: bytes) -> tuple:
    import torch

    from torch._dynamo.utils import counters

    from pypto_rt.replay import tier_inductor, tier_request
    from pypto_rt.replay.tier_source import Untierable

    try:
        request = torch.load(io.BytesIO(data), weights_only=False)
        sys.path[:0] = [p for p in request["path"] if p not in sys.path]
        if request["cache"]:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = request["cache"]
        hits, misses = _cache_counts(counters)
        made = tier_inductor.artifact(tier_request.function(request), request["examples"], request["values"],
                                      request["threads"], tier_request.preparer(request["prepare"]),
                                      request["dynamic"])
        after = _cache_counts(counters)
        return "ok", dict(made, cache=(after[0] - hits, after[1] - misses))
    except Untierable as e:
        return "kept", str(e)
    except Exception as e:   # noqa: BLE001 - whatever the compiler raises goes back to the parent
        from pypto_rt.replay.tier import _first_line

        return "failed", f"{type(e).__name__}: {_first_line(e)}"


def _cache_counts(counters) -> tuple[int, int]:
    """(hits, misses) of inductor's FX-graph cache so far (read afresh: a compile may replace the counters)."""
    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def _lower_priority(nice: int) -> str:
    """Lower this process's (its main thread's, inherited by what it starts) priority to `nice`; how it runs."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as e:
        return f"at normal priority (lowering it was refused: {e})"
    return f"at idle priority, nice {nice}"


def _end_with_parent(parent: int) -> None:
    """Die with the parent: the parent-death signal (Linux), else a thread watching for the child's reparenting."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # (PR_SET_PDEATHSIG)
        if os.getppid() != parent:   # (gone before the signal was armed)
            os._exit(0)
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, name="pypto-rt-tier-child-watch", daemon=True).start()


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:5]))
