"""Opaque calls in a recording: a block recorded as one call of its kernel instead of its torch calls.

A block of a communication task waits for peers, writes their windows and reads what they wrote: its effects lie
outside torch, so its torch calls cannot stand for it. A block whose course depends on data the run computed
cannot be replayed as torch calls either (a guard would come too late; replay.entry records such a run again). The
recorder (replay.capture) runs such a block *muted* (its torch calls are not recorded, `pld` refusals, guards and
`pl.read`s inside it do not reach the recording) and writes one line that calls it again:
`t7 = o3(0, f4(v2, k5, (s1, 16), False, None), a3, s2)`, with `o3` the caller's block call (`call(block, *inputs)`:
the kernel's own run function, its block count, its comm label if any) and its inputs as code of the replay:
- a TensorValue as one built again around its tensor's name (an entry tensor, a tensor the run made, or an
  outside tensor by reference), its dtype, its valid box (numbers read from data stay code), tile flag and pad;
- a number read from data (or computed from one) as its code, so an epoch or a row count changes per replay;
  other numbers, strings, dtypes and enums as literals or constants.
What the block writes (`written`, its Out/InOut accesses) is from then on data the run computed: no prologue reads
of it, no guard on it. Its return value (a region's results) is named where the host uses it: a tensor already
named keeps its name, a new one is taken from the call's result, and a number is read from it where the block
returns it (code for whatever uses it; a guard on it refuses the recording: it would come too late).
"""
from __future__ import annotations

import contextlib
import enum

import torch

from pypto_rt.incore_compiler.kernel_ir import Unbound
from pypto_rt.language.dtypes import DataType
from pypto_rt.ops import recording
from pypto_rt.ops.value import TensorValue
from pypto_rt.replay.calls import SIMPLE, Refused, storage_id
from pypto_rt.replay.records import Call, Code, Ref, joined
from pypto_rt.replay.scalars import TRACED, untraced

CALL_PREFIX = "o"   # a block's call is the constant o<N> (the compiled tier finds the lines by it)
_CONSTANTS = (DataType, Unbound, enum.Enum, bytes)   # immutable inputs written as constants


def record_block(rec, call, inputs: tuple, block: int, written) -> object:
    """Run `call(block, *inputs)` muted and record it as one line of `rec`'s trace; its return value."""
    if rec.refused is not None:
        with muted(rec):
            return call(block, *plain_inputs(inputs))
    try:
        code = (rec._const(call, CALL_PREFIX), "(", str(block), ", ") + joined([code_of(rec, v) for v in inputs]) + \
            (")",)
    except Refused as r:
        rec.refuse(str(r))
        with muted(rec):
            return call(block, *plain_inputs(inputs))
    with muted(rec):
        result = call(block, *plain_inputs(inputs))
    line = Call(code, [t for t in code if type(t) is Ref], True, tainted=True)
    for index in written:
        value = inputs[index] if index < len(inputs) else None
        if type(value) is TensorValue:
            storage = storage_id(value.data)
            rec._written.add(storage)
            rec._tainted.add(storage)
            line.written.append(rec.names[id(value.data)])
            line.written_storages.append(storage)
    rec.recorded.append(line)
    rec.opaque_calls += 1
    if result is not None:
        line.out = f"t{len(rec.recorded) - 1}"
        try:
            return _name_results(rec, line.out, (), result)
        except Refused as r:
            rec.refuse(str(r))
    return result


@contextlib.contextmanager
def muted(rec):
    """`rec` sees nothing of what runs inside: no torch call recorded, no refusal or `pl.read` reaching it, no
    guard made (the block gets plain numbers)."""
    active, rec.active, rec._muted = rec.active, False, True
    recording.pop()
    try:
        yield
    finally:
        recording.push(rec)
        rec._muted = False
        rec.active = active and rec.refused is None


def code_of(rec, value) -> Code:
    """An input of the block (or an operand of a recorded `pld` effect, replay.comm_block) as code of the
    replay (see the module text)."""
    kind = type(value)
    if kind is TensorValue:
        parts = [rec._render(value.data), (rec._const(value.dtype, "k"),), rec._render(value.valid),
                 (repr(value.is_tile),), code_of(rec, value.pad)]
        return (rec._const(TensorValue, "f"), "(") + joined(parts) + (")",)
    if kind in TRACED or isinstance(value, (torch.Tensor, float) + SIMPLE) and not isinstance(value, enum.Enum):
        return rec._render(value)
    if kind is tuple or kind is list:
        inner = joined([code_of(rec, v) for v in value])
        return ("(",) + inner + (",)",) if kind is tuple else ("[",) + inner + ("]",)
    if isinstance(value, _CONSTANTS):
        return (rec._const(value, "k"),)
    raise Refused(f"a communication block takes a {kind.__name__}, which the trace cannot write down")


def plain_inputs(inputs: tuple) -> tuple:
    """The inputs with numbers read from data as plain numbers (the block runs as any replay will run it)."""
    return tuple(_plain_value(v) for v in inputs)


def _plain_value(value):
    kind = type(value)
    if kind in TRACED:
        return untraced(value)
    if kind is TensorValue and value.valid is not None and any(type(v) in TRACED for v in value.valid):
        return TensorValue(value.data, value.dtype, tuple(untraced(v) for v in value.valid), value.is_tile,
                           value.pad)
    if kind is tuple or kind is list:
        return kind(_plain_value(v) for v in value)
    return value


def _name_results(rec, out: str, path: tuple, result):
    """The block's return value as the host goes on with it: each new tensor in it named after the call's result
    (`v9 = t7[0].data`), each number a value read where the block made it (`s4 = t7[1]`: code for what uses it;
    a guard on it refuses, as for any number read from data the run computed)."""
    kind = type(result)
    index = "".join(f"[{i}]" for i in path)
    if result is None or kind is bool or kind is str:
        return result
    if kind is TensorValue:
        data = result.data
        if id(data) not in rec.names:
            part = Call((Ref(out), f"{index}.data"), [out], False, tainted=True)
            part.out = rec._define(data, True)
            rec.recorded.append(part)
        return result
    if kind is tuple or kind is list:
        return kind(_name_results(rec, out, path + (i,), r) for i, r in enumerate(result))
    if kind is int or kind is float:
        return rec.computed_number(result, (Ref(out), index), [out])
    raise Refused(f"a block called as it is returns a {kind.__name__} to the host program, which the trace "
                  "cannot follow")
