"""The entry of a host-form program: its body runs here on the reference executor (eagerly, in program order), which
hands each `f(..., device=r)` to the job as a dispatch."""
from __future__ import annotations

import os

from pypto_rt import config
from pypto_rt.collective import process
from pypto_rt.errors import NotSupportedError, PyptoError
from pypto_rt.host_form.forked_job import ForkedJob
from pypto_rt.language._runtime import activate
from pypto_rt.ops.value import TensorValue
from pypto_rt.reference.executor import ReferenceExecutor


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
    job = ForkedJob(len(device_ids()), binding)
    try:
        executor = ReferenceExecutor(binding, dispatch=job.dispatch)
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

