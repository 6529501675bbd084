"""Which receive form and which combine sums a layout takes (kernels.moe.dispatch.Layout): the choices the
benchmark's measurements made (docs/benchmarks.md, "The combine's sums by layout")."""
import pytest
import torch

from pypto_rt.kernels.moe import dispatch


def _layout(world, max_tokens, hidden, dtype=torch.bfloat16, top_k=6):
    return dispatch.Layout(world=world, num_experts=8 * world, top_k=top_k, max_tokens=max_tokens, hidden=hidden,
                           dtype=dtype)


def test_decode_t8_is_fixed_to_4_ranks_and_t128_and_prefill_are_live():
    assert _layout(2, 8, 4096).fixed_shape and _layout(4, 8, 4096).fixed_shape
    assert not _layout(8, 8, 4096).fixed_shape   # 1 route slot in 8 lives on a rank: the live form
    assert not _layout(8, 128, 4096).fixed_shape
    assert not _layout(2, 1024, 1024, top_k=8).fixed_shape


@pytest.mark.parametrize("world, hidden, dtype, live", [
    (2, 4096, torch.bfloat16, False),    # 2 ranks: the pass over every route slot won at T=128
    (4, 4096, torch.bfloat16, True),     # 8 KiB rows from 4 ranks: the live routes only
    (8, 4096, torch.bfloat16, True),
    (4, 1024, torch.bfloat16, False),    # 2 KiB rows (the prefill row): every route slot won at 4 ranks
    (8, 1024, torch.bfloat16, True),     # ... and lost at 8 (a route slot in 8 lives here)
    (4, 2048, torch.float32, True),      # 8 KiB rows in FP32
])
def test_the_default_sums_follow_the_ranks_and_the_row_length(monkeypatch, world, hidden, dtype, live):
    monkeypatch.setattr(dispatch, "COMPILED_SUMS", "auto")
    assert _layout(world, 128, hidden, dtype).live_sums is live


@pytest.mark.parametrize("choice, live", [("every", False), ("live", True)])
def test_a_set_choice_holds_for_every_layout(monkeypatch, choice, live):
    monkeypatch.setattr(dispatch, "COMPILED_SUMS", choice)
    assert {_layout(w, 128, h).live_sums for w in (2, 8) for h in (1024, 4096)} == {live}
