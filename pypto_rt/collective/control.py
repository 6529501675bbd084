"""The control segment each shm rank owns: its layout, states and op codes, and how peers judge its liveness.

int64 cells, each written only by the owning rank:
  EPOCH      barrier generation: rank r has arrived at barrier e once EPOCH >= e
  OPS+e%2    code of the op whose barrier is epoch e, SIZES+e%2 its byte size (-1: not compared), CALLS+e%2
             a 64-bit digest of the call's signature (op, shape, dtype, scalar arguments: base.signature), whose
             text is at CALL_AT + (e%2) * CALL_MAX (CALL_LENS+e%2 bytes). Peers compare them after passing
             barrier e: a rank is never more than one barrier ahead, so slot e%2 still holds its epoch-e call
  STATE      RUNNING / CLOSED / ABORTED (then REASON_LEN bytes of text at REASON_AT say why)
  PID        lets peers notice a rank that died without aborting
  GEN+h      generation of the rank's collective staging segment of half h
"""
from __future__ import annotations

import functools
import hashlib
import os

EPOCH, STATE, PID, GEN, OPS, SIZES, REASON_LEN, CALLS, CALL_LENS = 0, 1, 2, 3, 5, 7, 9, 10, 12
REASON_AT, REASON_MAX = 512, 2048
CALL_AT, CALL_MAX = REASON_AT + REASON_MAX, 256
SIZE = CALL_AT + 2 * CALL_MAX
RUNNING, CLOSED, ABORTED = 1, 2, 3

OP_CODES = {op: i + 1 for i, op in enumerate((
    "start", "barrier", "alloc_window", "allreduce", "allgather", "reduce_scatter", "all_to_all", "all_to_all_v",
    "broadcast", "close"))}


def alive(pid: int) -> bool:
    """False once process `pid` has exited (gone, or a zombie nobody reaped yet). Ranks share one host."""
    if pid in (0, os.getpid()):
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def reason(cells64, mm) -> str:
    n = cells64[REASON_LEN]
    return bytes(mm[REASON_AT:REASON_AT + n]).decode(errors="replace") if n else ""


def set_reason(cells64, mm, text: str) -> None:
    data = text.encode()[:REASON_MAX]
    mm[REASON_AT:REASON_AT + len(data)] = data
    cells64[REASON_LEN] = len(data)


@functools.lru_cache(maxsize=1024)   # a loop repeats its calls: ~0.2 µs instead of ~2
def digest(call: str) -> int:
    return int.from_bytes(hashlib.blake2b(call.encode(), digest_size=8).digest(), "little", signed=True)


def post_call(cells64, mm, slot: int, op: str, nbytes: int, call: str) -> None:
    """Record this rank's call for barrier slot `slot` (before the epoch that publishes it). The slot's text
    always matches its digest cell, so an unchanged digest means the text is there already."""
    d = digest(call)
    if cells64[CALLS + slot] != d:
        data = call.encode()[:CALL_MAX]
        at = CALL_AT + slot * CALL_MAX
        mm[at:at + len(data)] = data
        cells64[CALL_LENS + slot] = len(data)
        cells64[CALLS + slot] = d
    cells64[OPS + slot] = OP_CODES[op]
    cells64[SIZES + slot] = nbytes


def call_text(cells64, mm, slot: int) -> str:
    at = CALL_AT + slot * CALL_MAX
    return bytes(mm[at:at + cells64[CALL_LENS + slot]]).decode(errors="replace")
