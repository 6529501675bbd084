"""An entry's or a block's return value as a plan: which of the replay function's outputs go where."""
from __future__ import annotations

import operator

from pypto_rt.ops.value import TensorValue
from pypto_rt.replay.scalars import TRACED, untraced


class Unreplayable(Exception):
    """The return value cannot be rebuilt from the recorded tensors; the message says why."""


def result_plan(result, recorder, what: str = "the entry"):
    """`what`'s return value as a plan: tensor names from the trace, other values kept as they are."""
    if isinstance(result, TensorValue):
        name = recorder.name_of(result.data)
        if name is None:
            raise Unreplayable(f"{what} returns a tensor the trace did not make")
        return ("tensor", name, result.dtype, result.valid, result.is_tile, result.pad)
    if isinstance(result, (tuple, list)):
        return (type(result), [result_plan(r, recorder, what) for r in result])
    if result is None or type(result) in (int, float, bool, str):
        return ("value", result)
    if type(result) in TRACED:
        raise Unreplayable(f"{what} returns a value read from tensor data"
                           + ("" if what == "the entry" else " or computed from its scalar inputs"))
    raise Unreplayable(f"{what} returns a {type(result).__name__}")


def plain_scalars(result):
    """The recorded call's return value with values read from data as plain numbers."""
    if type(result) in TRACED:
        return untraced(result)
    if type(result) in (tuple, list):
        return type(result)(plain_scalars(r) for r in result)
    return result


def number_outputs(plan, outputs: list):
    """Replace tensor names by positions in the replay function's output tuple."""
    if plan[0] == "tensor":
        outputs.append(plan[1])
        return ("tensor", len(outputs) - 1) + plan[2:]
    if plan[0] == "value":
        return plan
    return (plan[0], [number_outputs(p, outputs) for p in plan[1]])


def rebuild(plan, outputs, bound: bool = True):
    """The entry's return value: TensorValues (bound) or the torch tensors the caller gets (not bound)."""
    if plan[0] == "tensor":
        _, index, dtype, valid, is_tile, pad = plan
        return TensorValue(outputs[index], dtype, valid, is_tile, pad) if bound else outputs[index]
    if plan[0] == "value":
        return plan[1]
    return plan[0](rebuild(p, outputs, bound) for p in plan[1])


def plain_rebuilder(plan):
    """`rebuild(plan, outputs, bound=False)` as one function of the outputs, made once per recording (a replayed
    call builds its result with the fewest Python operations)."""
    if plan[0] == "tensor":
        return operator.itemgetter(plan[1])
    if plan[0] == "value":
        value = plan[1]
        return lambda outputs: value
    kind, parts = plan[0], plan[1]
    if kind is tuple and len(parts) > 1 and all(p[0] == "tensor" for p in parts):
        return operator.itemgetter(*(p[1] for p in parts))   # (a tuple of two or more outputs)
    builders = [plain_rebuilder(p) for p in parts]
    return lambda outputs: kind(build(outputs) for build in builders)
