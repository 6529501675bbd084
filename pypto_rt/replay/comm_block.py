"""Signalling blocks recorded op by op: a communication block's `pld` ops as recorded calls of their effects.

A block of a communication task that calls `pld` ops runs *signalling* under the recorder (orchestration sets
`Recorder.signalling` while it runs): its plain torch calls are recorded as any block's, and each `pld` op
(notify, wait, remote_store, put: pypto_rt.ops.distributed) becomes one line calling the op's effect on what it
resolved when recorded: the window buffer, the byte offset of the cell or the view of this rank's window whose
place the peer's copy shares, the wait's region label, cell and peers (its deadline and multi-rank report are the
communicator's, as in any run): `communicate(reason, effect, resolve, fixed, values)` below, e.g.
`f3(k4, 1, 8, 'set', s2)` for a notify of value `s2` (an epoch read with `pl.read`: code, so it changes per replay).
The lines keep program order: each is an effect on data the run computed (windows are volatile, replay.capture).

What such a line cannot express refuses the recording inside the block, and the next recording calls the kernel's
blocks as they are (replay.opaque, replay.entry; PYPTO_STATS says why): a peer or offset read from data (`fixed`:
they are resolved once), an op with no recorded form (remote_load, get, collectives: they refuse as before), and
the usual cases (a course depending on data the run computed or a window: a guard would come too late).
"""
from __future__ import annotations

import torch

from pypto_rt.replay import opaque
from pypto_rt.replay.calls import SIMPLE, Refused
from pypto_rt.replay.records import Call, Ref, joined
from pypto_rt.replay.scalars import TRACED


def communicate(rec, reason: str, effect, resolve, fixed: tuple, values: tuple):
    """Run a `pld` op as `effect(*resolve(), *values)`, recorded as one line when `rec` records a signalling block
    (see the module text); otherwise the recording is refused with `reason`. `resolve` runs unseen by `rec` (its
    torch calls find windows and boxes: none is the run's); `fixed` must hold no number read from data."""
    with opaque.muted(rec):
        args = resolve()
    if rec.refused is None and not rec.signalling:
        rec.refuse(reason)
    if rec.refused is None and _has_traced(fixed):
        rec.refuse(f"{reason}, at a peer or offsets read from data (a recorded signal op keeps them fixed)")
    if rec.refused is None:
        try:
            code = (rec._const(effect, "f"), "(") + joined([_code(rec, v) for v in args + values]) + (")",)
        except Refused as r:
            rec.refuse(str(r))
        else:
            rec.recorded.append(Call(code, [t for t in code if type(t) is Ref], True, tainted=True))
            rec.signal_calls += 1
    return effect(*args, *opaque._plain(values))


def _has_traced(value) -> bool:
    if type(value) in TRACED:
        return True
    return isinstance(value, (tuple, list)) and any(_has_traced(v) for v in value)


def _code(rec, value):
    """An argument of an effect as code: tensors by name, numbers read from data as code, plain values as
    literals, anything else (a window buffer, an enum) as a constant."""
    if isinstance(value, torch.Tensor) or type(value) in TRACED or isinstance(value, SIMPLE + (float, tuple, list)):
        return rec._render(value)
    return (rec._const(value, "k"),)
