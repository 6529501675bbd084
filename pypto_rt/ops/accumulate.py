"""Atomic accumulation: how `pl.assemble(..., atomic=pl.AtomicType.Add)` (and `pl.store`'s) adds into its target.

Blocks of one task, and tasks the graph does not order (a manual scope), run on several workers at once, and
torch's in-place add runs outside the interpreter lock. So:
- by default every add holds a lock of its target's memory for the add's duration: no update is lost (as with
  the device's atomic add), and adds land in the order the blocks get there (the last bits of a float sum may
  then differ from run to run, as on the device);
- under `collecting(parts)` (orchestration.task_runner, PYPTO_DETERMINISTIC=1: a multi-block task) a block's
  adds are kept in `parts` instead, and the task's last block to finish applies every block's parts in block
  order (`apply`): the sums then do not depend on which block finished first, and no block waits for another.

`atomic_add_` is one call for a torch-call recording (replay.capture records it through torch's
`__torch_function__` protocol, like a torch function), so a replayed block or run adds through it too.
"""
from __future__ import annotations

import contextlib
import threading

from torch.overrides import handle_torch_function, has_torch_function_variadic

_STRIPES = 64   # locks shared by storage address: adds into different targets rarely wait for each other
_LOCKS = tuple(threading.Lock() for _ in range(_STRIPES))


class _Sink(threading.local):
    parts = None   # the list a block's adds go to (set by `collecting` on the thread running the block), or None


_sink = _Sink()


def atomic_add_(region, values) -> None:
    """`region += values` (`values` already in `region`'s dtype and shape), atomically; or noted for later when
    this thread is `collecting`."""
    if has_torch_function_variadic(region, values):   # a recording is active: it records this one call
        return handle_torch_function(atomic_add_, (region, values), region, values)
    parts = _sink.parts
    if parts is not None:
        # (a copy: the source tile may be changed in place after this op, before the task's last block applies it)
        parts.append((region, values.clone()))
        return None
    with _LOCKS[(region.untyped_storage().data_ptr() >> 6) % _STRIPES]:
        region.add_(values)
    return None


@contextlib.contextmanager
def collecting(parts: list):
    """Atomic adds made on this thread inside the block go to `parts` (region, values), in program order."""
    previous = _sink.parts
    _sink.parts = parts
    try:
        yield parts
    finally:
        _sink.parts = previous


def apply(parts_by_block) -> None:
    """Apply what each block collected, block after block, each block's adds in its own order."""
    for parts in parts_by_block:
        for region, values in parts or ():
            atomic_add_(region, values)
