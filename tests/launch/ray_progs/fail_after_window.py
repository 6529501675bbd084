"""Every rank allocates a shared-memory window; then rank 1 fails (`raise`), or kills its own Ray actor
(`kill-actor`: the rank's parent), while rank 0 waits in a barrier for it."""
import os
import signal
import sys
import time

import pypto.language.distributed as pld
from pypto_rt.collective import process

buf = pld.alloc_window_buffer(256)
comm = process.communicator("barrier")
if comm.rank == 1:
    if sys.argv[1] == "raise":
        raise RuntimeError("rank 1 broke on purpose after its window")
    os.kill(os.getppid(), signal.SIGKILL)   # the actor: as if its node died
    time.sleep(60)   # the rank dies with its actor (it would otherwise reach the barrier first)
comm.barrier(label="after_window")
print(f"rank {comm.rank}: unexpectedly passed")
