"""TensorSpec / ScalarSpec: tensor creation, argument validation, scalar encodings."""
import ctypes

import pytest
import torch

from pypto_rt.golden import ScalarSpec, TensorSpec


class TestTensorSpecCreate:
    def test_none_gives_zeros(self):
        t = TensorSpec("x", [2, 3], torch.bfloat16).create_tensor()
        assert t.shape == (2, 3) and t.dtype == torch.bfloat16
        assert torch.count_nonzero(t) == 0

    @pytest.mark.parametrize("value", [3, 2.5, -1])
    def test_number_fills(self, value):
        t = TensorSpec("x", (4,), torch.float32, init_value=value).create_tensor()
        assert torch.equal(t, torch.full((4,), float(value)))

    def test_tensor_is_cast_and_keeps_its_own_shape(self):
        src = torch.arange(6, dtype=torch.float64).reshape(3, 2)
        t = TensorSpec("x", [99], torch.int32, init_value=src).create_tensor()
        assert t.dtype == torch.int32 and t.shape == (3, 2)
        assert t.tolist() == [[0, 1], [2, 3], [4, 5]]

    @pytest.mark.parametrize("factory", [torch.randn, torch.rand, torch.zeros, torch.ones])
    def test_torch_factories_get_shape_and_dtype(self, factory):
        t = TensorSpec("x", [5, 7], torch.float16, init_value=factory).create_tensor()
        assert t.shape == (5, 7) and t.dtype == torch.float16

    def test_rand_draws_fresh_values_each_time(self):
        spec = TensorSpec("x", [64], torch.float32, init_value=torch.rand)
        assert not torch.equal(spec.create_tensor(), spec.create_tensor())

    def test_other_callable_is_called_without_args_and_converted(self):
        spec = TensorSpec("x", [3], torch.int64, init_value=lambda: [1.0, 2.0, 3.0])
        t = spec.create_tensor()
        assert t.dtype == torch.int64 and t.tolist() == [1, 2, 3]

    def test_closure_returning_tensor_is_cast(self):
        spec = TensorSpec("x", [2], torch.bfloat16, init_value=lambda: torch.tensor([1.0, 2.0]))
        assert spec.create_tensor().dtype == torch.bfloat16

    def test_unsupported_init_value_is_type_error(self):
        with pytest.raises(TypeError, match="'x'"):
            TensorSpec("x", [2], torch.float32, init_value="ones").create_tensor()

    def test_output_kinds(self):
        assert TensorSpec("y", [1], torch.float32, is_output=True).is_pure_output
        assert not TensorSpec("c", [1], torch.float32, init_value=0.0, is_output=True).is_pure_output
        assert not TensorSpec("x", [1], torch.float32).is_pure_output


class TestTensorSpecResident:
    @pytest.mark.parametrize("resident, expected", [(None, False), (False, False), (0, True), (3, True),
                                                    ("stacked", True)])
    def test_accepted(self, resident, expected):
        assert TensorSpec("w", [1], torch.float32, resident=resident).is_resident is expected

    @pytest.mark.parametrize("resident", [True, -1, "sharded", 1.0])
    def test_rejected(self, resident):
        with pytest.raises(ValueError, match="'w'"):
            TensorSpec("w", [1], torch.float32, resident=resident)


class TestScalarSpec:
    def test_value_becomes_zero_dim_tensor_of_dtype(self):
        s = ScalarSpec("n", torch.int32, 4096)
        assert isinstance(s.value, torch.Tensor) and s.value.ndim == 0 and s.value.dtype == torch.int32
        assert s.to_python() == 4096 and isinstance(s.to_python(), int)

    def test_half_values_are_rounded_to_dtype(self):
        assert ScalarSpec("a", torch.bfloat16, 1.00390625).to_python() == 1.0
        assert ScalarSpec("a", torch.float32, 0.1).to_python() == pytest.approx(0.1, rel=1e-7)
        assert ScalarSpec("a", torch.float32, 0.1).to_python() != 0.1  # FP32, not Python's double

    def test_int_accepted_for_float_dtype(self):
        assert ScalarSpec("a", torch.float16, 2).to_python() == 2.0

    @pytest.mark.parametrize("dtype, value", [(torch.int8, 128), (torch.int8, -129), (torch.uint8, -1),
                                              (torch.uint8, 256), (torch.int32, 2**31), (torch.int64, 2**63)])
    def test_int_range_checked(self, dtype, value):
        with pytest.raises(ValueError, match="range"):
            ScalarSpec("n", dtype, value)

    def test_int_range_edges_accepted(self):
        assert ScalarSpec("n", torch.int8, -128).to_python() == -128
        assert ScalarSpec("n", torch.int64, 2**63 - 1).to_python() == 2**63 - 1

    @pytest.mark.parametrize("dtype, value", [(torch.int32, True), (torch.int32, 1.0), (torch.bool, 1),
                                              (torch.float32, True), (torch.float32, "1.0")])
    def test_wrong_python_type_rejected(self, dtype, value):
        with pytest.raises(ValueError, match="'n'"):
            ScalarSpec("n", dtype, value)

    @pytest.mark.parametrize("dtype", [torch.int16, torch.float64, torch.complex64])
    def test_unsupported_dtype(self, dtype):
        with pytest.raises(ValueError, match="not supported"):
            ScalarSpec("n", dtype, 1)

    def test_tensor_value(self):
        assert ScalarSpec("n", torch.int32, torch.tensor(7, dtype=torch.int32)).to_python() == 7
        with pytest.raises(ValueError, match="differs"):
            ScalarSpec("n", torch.int32, torch.tensor(7, dtype=torch.int64))
        with pytest.raises(ValueError, match="0-dim"):
            ScalarSpec("n", torch.int32, torch.tensor([7], dtype=torch.int32))

    def test_to_ctypes(self):
        c = ScalarSpec("n", torch.int32, -5).to_ctypes()
        assert isinstance(c, ctypes.c_int32) and c.value == -5
        assert isinstance(ScalarSpec("n", torch.uint8, 200).to_ctypes(), ctypes.c_uint8)
        assert ScalarSpec("b", torch.bool, True).to_ctypes().value is True
        f = ScalarSpec("a", torch.float32, 0.5).to_ctypes()
        assert isinstance(f, ctypes.c_float) and f.value == 0.5

    @pytest.mark.parametrize("dtype, value, bits", [(torch.float16, 1.0, 0x3C00), (torch.bfloat16, 1.0, 0x3F80),
                                                    (torch.bfloat16, -2.0, 0xC000), (torch.float16, -0.0, 0x8000)])
    def test_half_to_ctypes_is_bit_pattern(self, dtype, value, bits):
        c = ScalarSpec("a", dtype, value).to_ctypes()
        assert isinstance(c, ctypes.c_uint16) and c.value == bits
