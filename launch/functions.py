"""Running a Python function on N ranks: `run_function(fn, *args, nproc=N, backend=...)` -> each rank's return value.

In the spirit of torch's `elastic_launch(config, fn)(*args)` and Ray's `TorchTrainer`, without their weight: the
job is an ordinary pypto-launch job (either backend, the same contract, report and clean-up) whose ranks run
`function_main`, which calls `fn(*args, **kwargs)` and pickles its return value next to the rank's error record;
the launcher (local) or the rank's actor (ray) brings it back. `fn` travels by pickle, so it must be importable by
name from the ranks' working directory (a module-level function, as with multiprocessing's spawn); `fn` and its
arguments travel on the ranks' command line (keep them small: pass large data by path).
"""
from __future__ import annotations

import base64
import os
import pickle
import shutil
import tempfile

from pypto_rt.launch.api import launch
from pypto_rt.launch.contract import RESULT_FILE

MODULE = "pypto_rt.launch.function_main"


def run_function(fn, *args, nproc: int = 1, backend: str = "local", kwargs: dict | None = None,
                 log_dir: str | None = None, **options) -> list:
    """Call `fn(*args, **kwargs)` on `nproc` ranks and return their return values, by rank. Raises `JobFailed`
    (its message the launcher's report, `.result.root_cause` the rank that failed first) when a rank fails, and
    `ConfigError` before any rank starts for arguments that cannot work. `options` are `launch`'s (comm,
    timeout_s, address, placement, rank_resources, ...); rank output goes to the terminal as `[rank N]` lines."""
    payload = base64.b64encode(pickle.dumps((fn, args, kwargs or {}), protocol=pickle.HIGHEST_PROTOCOL)).decode()
    folder = log_dir or tempfile.mkdtemp(prefix="pypto-run-function-")
    try:
        result = launch(MODULE, payload, nproc=nproc, module=True, backend=backend, log_dir=folder,
                        tee=True if log_dir is None else options.pop("tee", False), **options).check()
        return [_load(os.path.join(folder, RESULT_FILE.format(rank=r.rank))) for r in result.ranks]
    finally:
        if log_dir is None:
            shutil.rmtree(folder, ignore_errors=True)


def _load(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)
