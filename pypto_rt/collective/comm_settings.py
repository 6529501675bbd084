"""The settings communicators read, and how they read them; every knob is declared in `pypto_rt.knobs`.

Its own settings (PYPTO_TIMEOUT_S, PYPTO_START_TIMEOUT_S, PYPTO_COMM_CHECK, PYPTO_SHM_PREFIX, PYPTO_SHM_BLOCK,
PYPTO_SHM_POLL_US) and the launcher's
rank contract (torchrun's names: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""
from __future__ import annotations

from pypto_rt import knobs
from pypto_rt.errors import PyptoError
from pypto_rt.knobs import (COMM_CHECK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, RANK, SHM_BLOCK,  # noqa: F401
                            SHM_POLL_US, SHM_PREFIX, START_TIMEOUT_S, WORLD_SIZE, Knob)


def timeout_s() -> float:
    """PYPTO_TIMEOUT_S: the deadline of every blocking wait after the start rendezvous."""
    return knobs.get_float(knobs.TIMEOUT_S)


def start_timeout_s() -> float:
    return knobs.get_float(START_TIMEOUT_S)


def comm_check() -> bool:
    return COMM_CHECK.on()


def shm_block() -> bool:
    """PYPTO_SHM_BLOCK: shm waits block on a futex of their cell (where the platform has one)."""
    return SHM_BLOCK.on()


def shm_poll_s() -> float | None:
    """PYPTO_SHM_POLL_US in seconds: how long a futex-backed shm wait polls (yielding) before it blocks; None when
    unset (the default): each wait's budget is then poll_policy.PollPolicy's."""
    us = knobs.get_int(SHM_POLL_US, minimum=0)
    return None if us is None else us * 1e-6


def launched_int(knob: Knob, given: int | None, what: str) -> int:
    """`given`, else the launcher's variable; a process started some other way must pass it."""
    if given is not None:
        return int(given)
    value = knobs.get_int(knob)
    if value is None:
        raise PyptoError(f"the communicator's {what} is unknown: pass {what}= or set {knob.env}",
                         hint="pypto-launch (and torchrun) set RANK and WORLD_SIZE for every rank")
    return value
