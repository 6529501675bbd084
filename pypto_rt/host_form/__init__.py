"""The host form of a multi-rank program: a `@pl.jit.host` function runs in this process and dispatches chip
programs with `device=r` to one rank process per device id, which this runtime starts itself.

    host process                                   rank process r (forked; one per device id)
    ------------                                   ----------------------------------------------
    share the entry's tensors (share_memory_)      shm communicator (rank r of n), installed as
    fork the ranks, host their TCPStore            this process's communicator
    run the host body (reference executor):
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
without ending the job (SIGKILL), its ranks end at once and the last one out removes the segments (lifeline).

Modules, one job each: `host_body` (the entry: the host body, with `device=` calls dispatched), `forked_job`
(the host's side of the job: rank processes, store, pipes, joining, first failure, teardown), `rank_loop` (a rank
process's message loop), `messages` (what crosses the pipes: kernels, arguments, failure reports), `lifeline`
(ranks never outlive the host). The driver reaches this package through `host_body.run_host` only.
"""
