"""The knobs this package reads: its own PYPTO_* settings and the launcher's rank contract (torchrun's names).

Declared with `pypto_rt.config.Knob` so they read the environment the same way (and honour `config._overrides`).
PYPTO_TIMEOUT_S itself lives in `pypto_rt.config`.
"""
from __future__ import annotations

from pypto_rt import config
from pypto_rt.config import Knob
from pypto_rt.errors import PyptoError

START_TIMEOUT_S = Knob("PYPTO_START_TIMEOUT_S", "120", None,
                       "seconds a new communicator waits for every rank to start (its rendezvous); waits inside "
                       "the job use PYPTO_TIMEOUT_S, whose clock starts only after this rendezvous")
COMM_CHECK = Knob("PYPTO_COMM_CHECK", "0", ("0", "1"),
                  "before each collective, ranks compare (sequence number, op, shape, dtype) through the store: a "
                  "mismatch is an error naming both ranks instead of a hang")
SHM_PREFIX = Knob("PYPTO_SHM_PREFIX", "", None,
                  "name prefix of this job's /dev/shm segments (no '+': segments are <prefix>+...), set by the "
                  "launcher (which then removes /dev/shm/<prefix>+* at job end); unset: the communicator picks one "
                  "and unlinks its own segments")

# the launcher's contract (torchrun's variable names)
RANK = Knob("RANK", "", None, "this process's rank")
LOCAL_RANK = Knob("LOCAL_RANK", "", None, "this process's rank on its host (picks its GPU / NPU)")
WORLD_SIZE = Knob("WORLD_SIZE", "", None, "ranks in the job")
MASTER_ADDR = Knob("MASTER_ADDR", "", None, "host of the job's TCPStore")
MASTER_PORT = Knob("MASTER_PORT", "", None, "port of the job's TCPStore")


def timeout_s() -> float:
    """PYPTO_TIMEOUT_S: the deadline of every blocking wait after the start rendezvous."""
    return config.get_float(config.TIMEOUT_S)


def start_timeout_s() -> float:
    return config.get_float(START_TIMEOUT_S)


def comm_check() -> bool:
    return COMM_CHECK.get() == "1"


def launched_int(knob: Knob, given: int | None, what: str) -> int:
    """`given`, else the launcher's variable; a process started some other way must pass it."""
    if given is not None:
        return int(given)
    value = config.get_int(knob)
    if value is None:
        raise PyptoError(f"the communicator's {what} is unknown: pass {what}= or set {knob.env}",
                         hint="pypto-launch (and torchrun) set RANK and WORLD_SIZE for every rank")
    return value
