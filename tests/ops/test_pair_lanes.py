"""A mask gather of a sort32 pair row reads the lanes the row was built from (ops.pair_lanes): the same bits as
picking the interleaved row's positions, for either kind of lane, any row or column window; a write into the row
since voids it; and it reads nothing of the interleaved row (so a replay can drop the interleaving)."""
import pytest
import torch

from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import MaskPattern
from pypto_rt.ops import gather as G
from pypto_rt.ops import sort as S
from pypto_rt.ops.value import TensorValue

ROWS, WIDTH = 3, 64


def _pairs():
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(ROWS, WIDTH, generator=gen)
    keys[1, 5] = float("nan")                               # any bit pattern survives in the lanes
    ids = torch.randint(0, 2**31 - 1, (ROWS, WIDTH), generator=gen)
    return S.sort32(TensorValue(keys, D.FP32, None, True), TensorValue(ids, D.UINT32, None, True))


def _unnoted(view: torch.Tensor) -> torch.Tensor:
    """The same positions in a copy nothing noted (the interleaved row as it is)."""
    return view.clone()


@pytest.mark.parametrize("pattern, dtype", [(MaskPattern.P0101, D.FP32), (MaskPattern.P1010, D.INT32),
                                            (MaskPattern.P0101, D.INT32), (MaskPattern.P1010, D.FP32)])
@pytest.mark.parametrize("rows, cols", [(slice(0, 3), slice(0, 128)), (slice(1, 3), slice(0, 6)),
                                        (slice(2, 3), slice(3, 10)), (slice(0, 2), slice(7, 8))])
def test_picks_the_same_bits_as_the_interleaved_row(pattern, dtype, rows, cols):
    pairs = _pairs()
    view = pairs.data[rows, cols]
    got = G.gather(TensorValue(view, D.FP32, None, True), mask_pattern=pattern, output_dtype=dtype)
    want = G.gather(TensorValue(_unnoted(view), D.FP32, None, True), mask_pattern=pattern, output_dtype=dtype)
    assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape
    assert torch.equal(got.data.view(torch.int32), want.data.view(torch.int32))


def test_a_write_into_the_row_since_is_seen():
    pairs = _pairs()
    pairs.data[0, 1] = torch.tensor(7, dtype=torch.int32).view(torch.float32)    # index lane of element 0
    got = G.gather(TensorValue(pairs.data[:, 0:4], D.FP32, None, True), mask_pattern=MaskPattern.P1010,
                   output_dtype=D.INT32)
    assert int(got.data[0, 0]) == 7


class _Reads(torch.overrides.TorchFunctionMode):
    """The storages (addresses) of the tensors the torch calls made inside it take, of the calls that make a tensor
    (not attribute reads such as `_base`)."""

    def __init__(self):
        super().__init__()
        self.storages = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if isinstance(result, torch.Tensor) and getattr(func, "__name__", "") != "__get__":
            for a in list(args) + list((kwargs or {}).values()):
                if isinstance(a, torch.Tensor):
                    self.storages.add(a.untyped_storage().data_ptr())
        return result


@pytest.mark.parametrize("pattern", [MaskPattern.P0101, MaskPattern.P1010])
def test_the_interleaved_row_is_not_read(pattern):
    pairs = _pairs()
    best = TensorValue(pairs.data[:, 0:8], D.FP32, None, True)
    with _Reads() as reads:
        G.gather(best, mask_pattern=pattern, output_dtype=D.INT32)
    assert pairs.data.untyped_storage().data_ptr() not in reads.storages
