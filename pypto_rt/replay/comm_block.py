"""Signalling blocks recorded op by op: a communication block's `pld` ops as recorded calls of their effects.

A block of a communication task that calls `pld` ops runs *signalling* under the recorder (orchestration sets
`Recorder.signalling` while it runs): its plain torch calls are recorded as any block's, and each `pld` op
(notify, wait, remote_store, put: pypto_rt.ops.distributed) becomes one line calling the op's effect on its
operands, `communicate(rec, reason, effect, args)` below: e.g. `comm3(a14, 1, [0, 0], 'set', s2)` for a notify of
value `s2` (an epoch read with `pl.read`) on the entry window `a14`. The operands are code of the replay: window
tensors by name (an entry window, or a view the run made of one: a replay with other windows of the same shapes
signals on those), numbers read from data as code (a peer, an offset, a value change per replay); the effect
finds the window buffer, the peer's bytes and the cell at replay, as the op does, and a wait keeps its region
label, deadline and multi-rank report. An effect that can `bind()` gives each line its own instance, which keeps its
window operand resolved between calls and looks it up again when the operand's address, shape, strides, dtype or
the job's windows change (ops.distributed: a put is then one copy into a view of the peer's window). The effect
runs unseen by the recorder (its torch calls are its own). The lines keep program order: each is an effect on data
the run computed (windows are volatile, replay.capture).

What cannot be recorded so refuses the recording inside the block, and the next recording calls the kernel's
blocks as they are (replay.opaque, replay.entry; PYPTO_STATS says why): an op with no recorded form (remote_load,
get, collectives: they refuse as before), and the usual cases (a course depending on data the run computed or on a
window: a guard would come too late; a box whose extent follows such data).
"""
from __future__ import annotations

from pypto_rt.replay import opaque
from pypto_rt.replay.calls import Refused
from pypto_rt.replay.records import Call, Ref, joined

EFFECT_PREFIX = "comm"   # a recorded effect's constant is named comm<N> (the compiled tier finds the lines by it)


def communicate(rec, reason: str, effect, args: tuple):
    """Run a `pld` op's `effect(*args)`, recorded as one line when `rec` records a signalling block (see the module
    text); otherwise the recording is refused with `reason`."""
    if rec.refused is None and not rec.signalling:
        rec.refuse(reason)
    if rec.refused is None:
        effect = getattr(effect, "bind", lambda: effect)()   # the line's own: it keeps its windows resolved
        try:
            code = (rec._const(effect, EFFECT_PREFIX), "(") + joined([opaque.code_of(rec, v) for v in args]) + (")",)
        except Refused as r:
            rec.refuse(str(r))
        else:
            rec.recorded.append(Call(code, [t for t in code if type(t) is Ref], True, tainted=True))
    with opaque.muted(rec):
        return effect(*opaque.plain_inputs(args))

