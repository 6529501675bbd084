"""The `pl` surface: names, dtypes, annotations, and its agreement with the op library."""
from __future__ import annotations

import pytest

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt.errors import OutsideKernelError, UnknownOpError
from pypto_rt.language import surface
from pypto_rt.language.types import ScalarType, TensorType
from pypto_rt.ops import OPS


def test_every_surface_op_has_an_implementation():
    missing = sorted(n for n in surface.qualified_names() - surface.EXECUTOR_INTRINSICS if n not in OPS)
    assert missing == []


def _pld_op_names() -> set[str]:
    """The qualified names of the `pld` op stubs: its namespaces' members and its collectives."""
    import pypto_rt.language.distributed as pld
    from pypto_rt.language.ops import OpStub
    members = {getattr(getattr(pld, ns), m).qualname for ns in ("system", "tensor", "tile")
               for m in dir(getattr(pld, ns))}
    return members | {v.qualname for v in vars(pld).values() if isinstance(v, OpStub)}


def test_every_implementation_is_reachable_from_the_surface():
    reachable = surface.qualified_names() | {"__getitem__", "__setitem__"} | _pld_op_names()
    assert sorted(set(OPS) - reachable) == []


def test_every_pld_op_has_an_implementation():
    assert sorted(_pld_op_names() - set(OPS)) == []


@pytest.mark.parametrize("dtype,nbytes,bits,is_float,signed", [
    (pl.FP32, 4, 32, True, False), (pl.BF16, 2, 16, True, False), (pl.INT8, 1, 8, False, True),
    (pl.UINT32, 4, 32, False, False), (pl.INT4, 1, 4, False, True), (pl.INDEX, 8, 64, False, True),
])
def test_dtype_queries(dtype, nbytes, bits, is_float, signed):
    assert dtype.get_byte() == nbytes
    assert dtype.get_bit() == bits
    assert dtype.is_float() is is_float
    assert dtype.is_signed_int() is signed


def test_annotations_are_subscriptable_at_import_time():
    n = pl.dynamic("N")
    t = pl.Tensor[[n, 64], pl.BF16]
    assert t == TensorType((n, 64), pl.BF16, None, "in")
    assert pl.Out[t].direction == "out" and pl.InOut[t].direction == "inout"
    assert pl.Scalar[pl.INT32] == ScalarType(pl.INT32)
    assert pl.TaskId == ScalarType(pl.TASK_ID)
    assert pld.DistributedTensor[[8, 16], pl.FP32].direction == "window"
    assert pl.Tile[[16, 16], pl.FP32].shape == (16, 16)
    assert pl.Array[4, pl.TASK_ID].extent == 4


def test_unknown_op_is_a_clear_error_and_an_attribute_error():
    with pytest.raises(UnknownOpError, match="unknown op or name pl.no_such_op"):
        pl.no_such_op  # noqa: B018
    assert not hasattr(pl, "no_such_op")
    with pytest.raises(UnknownOpError, match="pl.tile.no_such"):
        pl.tile.no_such  # noqa: B018


def test_ops_refuse_to_run_outside_a_kernel():
    with pytest.raises(OutsideKernelError, match="pl.add can only run inside a PyPTO kernel"):
        pl.add(1, 2)
    with pytest.raises(OutsideKernelError):
        list(pl.range(3))


def test_enums_and_aliases():
    assert pl.Mem is pl.MemorySpace
    assert int(pl.tile.MaskPattern.P1010) == 2
    assert pl.AtomicType.Add == 1 and pl.SplitMode.UP_DOWN == 1
    assert pl.PadValue.min is not pl.PadValue.zero


def test_pld_answers_outside_a_launcher(monkeypatch):
    monkeypatch.delenv("PYPTO_LAUNCHED", raising=False)
    assert pld.world_size() == 1
    assert pld.rank() == 0


def test_distributed_config_imports():
    from pypto.ir.distributed_compiled_program import DistributedConfig

    cfg = DistributedConfig(device_ids=[0, 1, 2])
    assert cfg.world_size == 3
