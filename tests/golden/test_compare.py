"""validate_golden and the comparator factories."""
import math

import pytest
import torch

from pypto_rt.golden import (error_distribution, mapped_pool_ratio_allclose, ratio_allclose, ratio_reldiff,
                             topk_pair_compare, validate_golden)


def call(cmp, actual, expected, outputs=None, inputs=None, rtol=1e-5, atol=1e-5):
    return cmp(actual, expected, actual_outputs=outputs or {}, expected_outputs={}, inputs=inputs or {},
               rtol=rtol, atol=atol)


class TestValidateGolden:
    def test_pass_prints_one_line_per_output(self, capsys):
        y = torch.ones(4, 8)
        validate_golden({"y": y, "z": y.int()}, {"y": y.clone(), "z": y.int()})
        out = capsys.readouterr().out.splitlines()
        assert out == ["[RUN]   'y' PASS  shape=(4, 8) dtype=torch.float32",
                       "[RUN]   'z' PASS  shape=(4, 8) dtype=torch.int32"]

    def test_tolerances_are_used(self):
        validate_golden({"y": torch.tensor([1.0])}, {"y": torch.tensor([1.05])}, rtol=0.0, atol=0.1)
        with pytest.raises(AssertionError):
            validate_golden({"y": torch.tensor([1.0])}, {"y": torch.tensor([1.05])}, rtol=0.0, atol=0.01)

    def test_failure_details(self, capsys):
        actual, expected = torch.zeros(2, 3), torch.zeros(2, 3)
        actual[1, 2] = 5.0
        with pytest.raises(AssertionError) as info:
            validate_golden({"y": actual}, {"y": expected}, rtol=1e-3, atol=1e-4)
        msg = str(info.value)
        assert msg.splitlines() == [
            "Output(s) does not match golden: ['y']",
            "  'y' FAIL  shape=(2, 3) dtype=torch.float32",
            "    Mismatched elements: 1/6  rtol=0.001 atol=0.0001",
            "    first 1 mismatches:",
            "    [5] actual=5.0, expected=0.0",
        ]
        assert "[RUN]   'y' FAIL  shape=(2, 3) dtype=torch.float32" in capsys.readouterr().out

    def test_at_most_twenty_mismatches_listed(self):
        with pytest.raises(AssertionError) as info:
            validate_golden({"y": torch.ones(100)}, {"y": torch.zeros(100)})
        msg = str(info.value)
        assert "Mismatched elements: 100/100" in msg and "first 20 mismatches:" in msg
        assert "[19] actual=" in msg and "[20] actual=" not in msg

    def test_nan_is_never_equal(self):
        nan = torch.tensor([float("nan")])
        with pytest.raises(AssertionError):
            validate_golden({"y": nan}, {"y": nan.clone()})

    def test_all_failures_aggregated(self):
        outputs = {"a": torch.ones(2), "b": torch.ones(2), "c": torch.ones(2)}
        golden = {"a": torch.zeros(2), "b": torch.ones(2), "c": torch.zeros(2)}
        with pytest.raises(AssertionError, match=r"golden: \['a', 'c'\]"):
            validate_golden(outputs, golden)

    def test_shape_mismatch_raises(self):
        with pytest.raises(ValueError, match="'y'"):
            validate_golden({"y": torch.ones(2, 3)}, {"y": torch.ones(3, 2)})

    def test_missing_golden_is_a_failure(self):
        with pytest.raises(AssertionError, match="no golden tensor"):
            validate_golden({"y": torch.ones(2)}, {})

    def test_custom_comparator_gets_everything_and_is_labelled(self, capsys):
        seen = {}

        def my_check(actual, expected, *, actual_outputs, expected_outputs, inputs, rtol, atol):
            seen.update(outputs=actual_outputs, golden=expected_outputs, inputs=inputs, rtol=rtol, atol=atol)
            return True, ""

        outputs, golden = {"y": torch.ones(3)}, {"y": torch.zeros(3)}
        inputs = {"x": torch.ones(1), "n": torch.tensor(3)}
        validate_golden(outputs, golden, rtol=0.5, atol=0.25, compare_fn={"y": my_check}, inputs=inputs)
        assert seen["outputs"] is outputs and seen["golden"] is golden and seen["inputs"] is inputs
        assert (seen["rtol"], seen["atol"]) == (0.5, 0.25)
        assert capsys.readouterr().out.strip() == "[RUN]   'y' PASS  shape=(3,) dtype=torch.float32 (my_check)"

    def test_custom_comparator_failure_detail(self):
        def strict(actual, expected, **_):
            return False, "    too far"

        with pytest.raises(AssertionError) as info:
            validate_golden({"y": torch.ones(3)}, {"y": torch.ones(3)}, compare_fn={"y": strict})
        assert "  'y' FAIL (strict)  shape=(3,) dtype=torch.float32\n    too far" in str(info.value)


class TestRatioAllclose:
    def test_budget_boundary(self):
        expected = torch.zeros(1000)
        actual = expected.clone()
        actual[:5] = 1.0  # round(0.005 * 1000) = 5 bad points allowed
        assert call(ratio_allclose(atol=0.1, rtol=0.0), actual, expected) == (True, "")
        actual[5] = 1.0
        ok, detail = call(ratio_allclose(atol=0.1, rtol=0.0), actual, expected)
        assert not ok and "error_count=6/1000" in detail and "threshold=5 pts" in detail
        assert "[0] actual=1" in detail

    def test_threshold_uses_round(self):
        expected = torch.zeros(100)  # round(0.5) == 0: a single bad point fails
        actual = expected.clone()
        actual[3] = 1.0
        assert not call(ratio_allclose(atol=0.1, rtol=0.0), actual, expected)[0]
        assert call(ratio_allclose(atol=0.1, rtol=0.0, max_error_ratio=0.015), actual, expected)[0]

    def test_rtol_scales_with_expected(self):
        expected = torch.tensor([100.0, 1.0])
        actual = torch.tensor([100.5, 1.0])
        assert call(ratio_allclose(atol=0.0, rtol=0.01, max_error_ratio=0.0), actual, expected)[0]
        assert not call(ratio_allclose(atol=0.0, rtol=0.001, max_error_ratio=0.0), actual, expected)[0]

    def test_none_tolerances_fall_back_to_harness(self):
        actual, expected = torch.tensor([1.0]), torch.tensor([1.2])
        cmp = ratio_allclose(max_error_ratio=0.0)
        assert call(cmp, actual, expected, atol=0.5, rtol=0.0)[0]
        assert not call(cmp, actual, expected, atol=0.01, rtol=0.0)[0]

    @pytest.mark.parametrize("bad", [float("nan"), float("inf")])
    def test_nonfinite_always_fails(self, bad):
        actual = torch.zeros(1000)
        actual[0] = bad
        ok, detail = call(ratio_allclose(atol=1.0, rtol=1.0, max_error_ratio=1.0), actual, torch.zeros(1000))
        assert not ok and "illegal values" in detail

    def test_compares_low_precision_in_fp32(self):
        expected = torch.full((8,), 1.0, dtype=torch.bfloat16)
        assert call(ratio_allclose(atol=1e-2, rtol=0.0), expected.clone(), expected)[0]

    def test_valid_rows(self):
        expected = torch.zeros(4, 3)
        actual = expected.clone()
        actual[2:] = 9.0
        cmp = ratio_allclose(atol=0.1, rtol=0.0, max_error_ratio=0.0, valid_rows=2)
        assert call(cmp, actual, expected)[0]
        ok, detail = call(ratio_allclose(atol=0.1, rtol=0.0, valid_rows=2, zero_tail=True), actual, expected)
        assert not ok and "inactive tail contains 6 nonzero values" in detail
        assert call(ratio_allclose(valid_rows=0), actual, expected)[0]
        ok, detail = call(ratio_allclose(valid_rows=5), actual, expected)
        assert not ok and "out of range" in detail

    def test_valid_axis(self):
        expected = torch.zeros(2, 4)
        actual = expected.clone()
        actual[:, 3] = 9.0
        assert call(ratio_allclose(atol=0.1, rtol=0.0, max_error_ratio=0.0, valid_rows=3, valid_axis=1),
                    actual, expected)[0]
        assert not call(ratio_allclose(atol=0.1, rtol=0.0, max_error_ratio=0.0, valid_rows=4, valid_axis=1),
                        actual, expected)[0]

    def test_bad_ratio_rejected(self):
        with pytest.raises(ValueError):
            ratio_allclose(max_error_ratio=1.5)

    def test_accepts_kwargs_forwarded_by_wrappers(self):
        cmp = ratio_allclose(atol=0.1, rtol=0.0)
        assert cmp(torch.zeros(2), torch.zeros(2))[0]
        assert cmp.__name__.startswith("ratio_allclose(")


class TestRatioReldiff:
    def test_small_absolute_differences_pass(self):
        actual, expected = torch.full((10,), 0.005), torch.zeros(10)
        assert call(ratio_reldiff(diff_thd=0.01, pct_thd=0.0), actual, expected)[0]

    def test_relative_difference_counted(self):
        expected = torch.full((10,), 0.4)
        actual = expected.clone()
        actual[0] = 0.5  # diff 0.1 -> rdiff 0.1 / 0.5 = 0.2 > 0.01
        ok, detail = call(ratio_reldiff(diff_thd=0.01, pct_thd=0.0), actual, expected)
        assert not ok and "error_count=1/10" in detail and "rdiff=0.2" in detail
        assert call(ratio_reldiff(diff_thd=0.01, pct_thd=0.1), actual, expected)[0]
        assert call(ratio_reldiff(diff_thd=0.3, pct_thd=0.0), actual, expected)[0]

    def test_floor_for_near_zero(self):
        # diff 0.02 >= diff_thd; denominator max(0.02, 0, 2^-14 / 0.01 = 0.0061) -> rdiff ~ 1
        ok, detail = call(ratio_reldiff(diff_thd=0.01, pct_thd=0.0), torch.tensor([0.02]), torch.tensor([0.0]))
        assert not ok and "rdiff=1" in detail

    def test_max_diff_hd_caps_worst_point(self):
        expected = torch.ones(100)
        actual = expected.clone()
        actual[0] = 3.0  # rdiff = 2 / 3
        assert call(ratio_reldiff(pct_thd=0.05), actual, expected)[0]
        ok, detail = call(ratio_reldiff(pct_thd=0.05, max_diff_hd=0.5), actual, expected)
        assert not ok and "max_diff_hd" in detail

    def test_nonfinite_fails(self):
        assert not call(ratio_reldiff(pct_thd=1.0), torch.tensor([float("nan")]), torch.tensor([1.0]))[0]

    @pytest.mark.parametrize("kwargs", [dict(diff_thd=0.0), dict(pct_thd=-0.1), dict(pct_thd=1.1),
                                        dict(max_diff_hd=0.0)])
    def test_bad_parameters(self, kwargs):
        with pytest.raises(ValueError):
            ratio_reldiff(**kwargs)


class TestTopkPairCompare:
    def test_equal_indices_pass(self):
        idx = torch.tensor([[3, 1, 0]])
        assert call(topk_pair_compare("v"), idx, idx.clone(), outputs={"v": torch.tensor([[9.0, 5, 1]])})[0]

    def test_tie_swap_accepted(self):
        vals = torch.tensor([[5.0, 3.0, 3.0, 1.0]])
        actual, expected = torch.tensor([[0, 2, 1, 3]]), torch.tensor([[0, 1, 2, 3]])
        assert call(topk_pair_compare("v"), actual, expected, outputs={"v": vals}) == (True, "")

    def test_order_break_at_mismatch_rejected(self):
        vals = torch.tensor([[5.0, 1.0, 3.0, 0.0]])
        actual, expected = torch.tensor([[0, 7, 2, 3]]), torch.tensor([[0, 1, 2, 3]])
        ok, detail = call(topk_pair_compare("v"), actual, expected, outputs={"v": vals})
        assert not ok
        assert "1 position(s)" in detail and "[0,1] actual_idx=7 expected_idx=1" in detail

    def test_order_break_without_mismatch_is_not_judged(self):
        vals = torch.tensor([[1.0, 5.0]])
        idx = torch.tensor([[0, 1]])
        assert call(topk_pair_compare("v"), idx, idx.clone(), outputs={"v": vals})[0]

    def test_ascending_and_dim0(self):
        vals = torch.tensor([[1.0], [2.0], [2.0]])
        actual, expected = torch.tensor([[4], [6], [5]]), torch.tensor([[4], [5], [6]])
        assert call(topk_pair_compare("v", dim=0, descending=False), actual, expected, outputs={"v": vals})[0]
        assert not call(topk_pair_compare("v", dim=0, descending=True), actual, expected, outputs={"v": vals})[0]

    def test_misconfigured(self):
        idx = torch.tensor([[0, 1]])
        ok, detail = call(topk_pair_compare("v"), idx, idx, outputs={"w": idx})
        assert not ok and "vals_name='v'" in detail
        ok, detail = call(topk_pair_compare("v"), idx, idx, outputs={"v": torch.zeros(3)})
        assert not ok and "shape mismatch" in detail
        ok, detail = call(topk_pair_compare("v", dim=2), idx, idx, outputs={"v": torch.zeros(1, 2)})
        assert not ok and "out of range" in detail

    def test_label(self):
        assert topk_pair_compare("v").__name__ == "topk_pair_compare"


def _pool_case():
    """Pool [4 blocks, 2 rows, 3]; mapping writes physical rows 0 and 5; -1 unused."""
    expected = torch.arange(24, dtype=torch.float32).reshape(4, 2, 3)
    mapping = torch.tensor([0, 5, -1], dtype=torch.int32)
    return expected.clone(), expected, {"slots": mapping}


class TestMappedPool:
    def cmp(self, **kw):
        args = dict(mapping_shape=(3,), block_size=2, atol=1e-3, rtol=0.0, max_error_ratio=0.0)
        args.update(kw)
        return mapped_pool_ratio_allclose("slots", **args)

    def test_identical_pass(self):
        actual, expected, inputs = _pool_case()
        assert call(self.cmp(), actual, expected, inputs=inputs) == (True, "")

    def test_mapped_row_checked_numerically(self):
        actual, expected, inputs = _pool_case()
        actual[2, 1, 0] += 1e-4  # physical row 5, within atol
        assert call(self.cmp(), actual, expected, inputs=inputs)[0]
        actual[2, 1, 0] += 1.0
        ok, detail = call(self.cmp(), actual, expected, inputs=inputs)
        assert not ok and "mapped rows in pool from 'slots'" in detail

    def test_unmapped_row_must_be_bit_identical(self):
        actual, expected, inputs = _pool_case()
        actual[0, 1, 2] += 1e-6  # physical row 1, not mapped
        ok, detail = call(self.cmp(), actual, expected, inputs=inputs)
        assert not ok and "unmapped physical pool row changed: row=1 changed_values=1" in detail

    @pytest.mark.parametrize("mapping, text", [([0, -2, -1], "only -1"), ([0, 8, -1], "outside physical row range"),
                                               ([3, 3, -1], "duplicate physical row 3")])
    def test_bad_mapping(self, mapping, text):
        actual, expected, _ = _pool_case()
        ok, detail = call(self.cmp(), actual, expected, inputs={"slots": torch.tensor(mapping)})
        assert not ok and text in detail

    def test_mapping_input_checks(self):
        actual, expected, _ = _pool_case()
        assert "missing input 'slots'" in call(self.cmp(), actual, expected)[1]
        assert "integer dtype" in call(self.cmp(), actual, expected, inputs={"slots": torch.zeros(3)})[1]
        bad_shape = {"slots": torch.zeros(4, dtype=torch.int64)}
        assert "must have shape (3,)" in call(self.cmp(), actual, expected, inputs=bad_shape)[1]

    @pytest.mark.parametrize("kw, text", [(dict(mapping_shape=(0,)), "mapping_shape must contain positive"),
                                          (dict(block_size=0), "block_size must be positive, got 0"),
                                          (dict(leading_rank_axis=True), "leading_rank_axis needs mapping_shape")])
    def test_arguments_that_cannot_work_are_refused_when_building(self, kw, text):
        with pytest.raises(ValueError, match=text):
            self.cmp(**kw)

    def test_layout_checks(self):
        actual, expected, inputs = _pool_case()
        assert "block_size=3" in call(self.cmp(block_size=3), actual, expected, inputs=inputs)[1]
        assert "shape mismatch" in call(self.cmp(), actual, expected[:2], inputs=inputs)[1]

    def test_leading_rank_axis_checks_duplicates_per_rank(self):
        expected = torch.zeros(2, 2, 2, 4)  # [ranks, blocks, block_size, hidden]
        actual = expected.clone()
        actual[1, 1, 0] = 7.0  # rank 1, physical row 2
        mapping = torch.tensor([[2, -1], [2, -1]])
        cmp = mapped_pool_ratio_allclose("m", mapping_shape=(2, 2), block_size=2, leading_rank_axis=True,
                                         atol=0.0, rtol=0.0, max_error_ratio=0.0)
        ok, detail = call(cmp, actual, expected, inputs={"m": mapping})
        assert not ok and "mapped rows" in detail  # same row number on both ranks is fine; rank 1's row differs
        ok, detail = call(cmp, actual, expected, inputs={"m": torch.tensor([[1, -1], [0, -1]])})
        assert not ok and "rank=1 row=2" in detail
        dup = torch.tensor([[1, 1], [0, -1]])
        assert "duplicate physical row 1 on rank 0" in call(cmp, actual, expected, inputs={"m": dup})[1]

    @pytest.mark.parametrize("kwargs", [dict(mapping_shape=()), dict(mapping_shape=(0,)), dict(block_size=0),
                                        dict(leading_rank_axis=True)])
    def test_bad_parameters(self, kwargs):
        args = dict(mapping_shape=(3,), block_size=2)
        args.update(kwargs)
        with pytest.raises(ValueError):
            mapped_pool_ratio_allclose("m", **args)


class TestErrorDistribution:
    def test_reports_and_passes(self, capsys):
        expected = torch.linspace(1, 2, 1000)
        actual = expected * 1.001
        assert call(error_distribution(), actual, expected) == (True, "")
        out = capsys.readouterr().out
        assert "rel-L2 = 0.1000%" in out and "cosine = 1.000000" in out and "numel=1000" in out
        assert "diff_thd=1e-03  frac>thd=" in out
        assert "rel-diff percentiles: p50=" in out and "p100=" in out and "|golden| mean=1.5" in out

    def test_nonfinite(self):
        actual = torch.tensor([float("nan"), 1.0])
        assert call(error_distribution(), actual, torch.ones(2))[0]
        ok, detail = call(error_distribution(always_pass=False), actual, torch.ones(2))
        assert not ok and "NaN=1" in detail

    def test_percentiles_match_torch_quantile(self, capsys):
        expected = torch.ones(101)
        actual = expected + torch.arange(101) / 1000.0
        call(error_distribution(quantiles=(0.25, 0.5)), actual, expected)
        out = capsys.readouterr().out
        q = torch.quantile((actual - expected).abs(), torch.tensor([0.25, 0.5])).tolist()
        assert f"abs-diff percentiles: p25={q[0]:.3g}  p50={q[1]:.3g}" in out
        assert not math.isnan(q[0])
