"""Index lanes proven in range (ops.index_range): a gather whose index is the index lanes of a sort32 over fixed ids
records no bounds check; a write since, a bound past the axis, ids from data or other lanes keep the check."""
import pytest
import torch

from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import MaskPattern
from pypto_rt.ops import gather as G
from pypto_rt.ops import index_range, recording
from pypto_rt.ops import sort as S
from pypto_rt.ops.value import TensorValue

ROWS, WIDTH = 4, 32


class _Recorder:
    """A recording whose fixed tensors are those given (the ids a kernel builds from constants)."""

    def __init__(self, fixed=()):
        self._fixed, self.muted = [id(t) for t in fixed], False

    def fixed(self, t) -> bool:
        return id(t) in self._fixed

    def mute(self, muted: bool) -> bool:
        was, self.muted = self.muted, muted
        return was

    def refuse(self, reason):
        raise AssertionError(reason)


class _Checks(torch.overrides.TorchFunctionMode):
    """Counts the recorded bounds checks (torch._assert_async) made inside it."""

    def __init__(self):
        super().__init__()
        self.checks = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.checks += func is torch._assert_async
        return func(*args, **(kwargs or {}))


def _ids(top: int) -> torch.Tensor:
    return torch.arange(WIDTH).clamp(max=top - 1).expand(ROWS, WIDTH).contiguous()


def _picked(ids: torch.Tensor, experts: int, fixed=True, write=None, pattern=MaskPattern.P1010):
    """Record sort32 -> first 4 pair positions -> mask gather of the index lanes -> gather of `experts` scores;
    (the number of recorded bounds checks, the picked scores)."""
    gen = torch.Generator().manual_seed(experts)
    scores = torch.rand(ROWS, experts, generator=gen)
    padded = torch.full((ROWS, WIDTH), torch.finfo(torch.float32).min)
    padded[:, :experts] = scores
    recording.push(_Recorder([ids] if fixed else []))
    try:
        with _Checks() as counted:
            pairs = S.sort32(TensorValue(padded, D.FP32, None, True), TensorValue(ids, D.UINT32, None, True))
            best = TensorValue(pairs.data[:, 0:4], D.FP32, None, True)
            if write is not None:
                write(best.data)
            chosen = G.gather(best, mask_pattern=pattern, output_dtype=D.INT32)
            picked = G.gather(TensorValue(scores, D.FP32, None, True), dim=-1, index=chosen)
    finally:
        recording.pop()
    return counted.checks, picked.data, scores


def test_sort_lanes_of_fixed_ids_need_no_recorded_check():
    checks, picked, scores = _picked(_ids(8), 8)
    assert checks == 0
    assert torch.equal(picked, torch.sort(scores, dim=-1, descending=True, stable=True).values[:, :2])


def test_ids_past_the_axis_keep_the_check():
    checks, _, _ = _picked(_ids(WIDTH), 8)      # pad slots carry ids 8..31: nothing proves them below 8
    assert checks == 1


def test_ids_from_data_keep_the_check():
    checks, _, _ = _picked(_ids(8), 8, fixed=False)
    assert checks == 1


def test_a_write_since_the_sort_voids_the_proof():
    def write(lanes):
        lanes.view(torch.int32)[0, 1] = 99     # an index lane out of range, written through a view
    with pytest.raises(RuntimeError, match="an index is outside axis 1"):
        _picked(_ids(8), 8, write=write)


def test_value_lanes_are_not_index_lanes():
    assert index_range.bound_of(torch.zeros(2, 8)) is None
    pairs = torch.zeros(2, 8).view(torch.float32)
    index_range.note(pairs, 4, index_range.ODD)
    assert index_range.bound_of(pairs, 1, 2) == 4 and index_range.bound_of(pairs[:, 2:4], 1, 2) == 4
    assert index_range.bound_of(pairs, 0, 2) is None and index_range.bound_of(pairs[:, 1:5], 1, 2) is None
    assert index_range.bound_of(pairs, 1, 1) is None
