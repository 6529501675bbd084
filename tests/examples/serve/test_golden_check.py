"""The flagship's golden check (examples/serve/golden_check.py): the golden's own tokens pass, one wrong token,
a missing token or a token outside the logits tolerance fails, naming the request and the position."""
import pytest

from examples.serve.golden_check import check_all, check_request
from pypto_rt.serving.model import DecoderConfig, GoldenDecoder, random_state_dict

CFG = DecoderConfig(vocab_size=64, hidden=32, num_layers=1, num_q_heads=4, num_kv_heads=2, head_dim=8, num_experts=4,
                    top_k=2, moe_intermediate=32, shared_intermediate=32, block_size=4)
PROMPTS = [[5, 9, 2, 7, 1], [3]]


@pytest.fixture(scope="module")
def golden():
    return GoldenDecoder(CFG, random_state_dict(CFG, seed=3))


@pytest.fixture(scope="module")
def outputs(golden):
    return golden.generate(PROMPTS, 5)


def test_the_goldens_own_tokens_pass(golden, outputs):
    verdicts = check_all(golden, {i: (p, out, 5) for i, (p, out) in enumerate(zip(PROMPTS, outputs))})
    assert [v.ok for v in verdicts] == [True, True]


def test_one_wrong_token_fails_and_names_its_position(golden, outputs):
    wrong = list(outputs[0])
    wrong[3] = (wrong[3] + 1) % CFG.vocab_size
    verdict = check_request(golden, 7, PROMPTS[0], wrong, 5)
    assert not verdict.ok and verdict.request_id == 7
    assert verdict.detail.startswith(f"output token 3: served {wrong[3]}, golden {outputs[0][3]}")


def test_a_missing_token_fails(golden, outputs):
    verdict = check_request(golden, 0, PROMPTS[0], outputs[0][:-1], 5)
    assert not verdict.ok and "served 4 tokens, expected 5" in verdict.detail


def test_a_tolerance_admits_a_near_top_token_and_only_that(golden, outputs):
    wrong = list(outputs[1])
    wrong[0] = (wrong[0] + 1) % CFG.vocab_size
    assert not check_request(golden, 1, PROMPTS[1], wrong, 5, tolerance=0.0).ok
    assert not check_request(golden, 1, PROMPTS[1], wrong, 5, tolerance=1e-6).ok
    assert check_request(golden, 1, PROMPTS[1], wrong, 5, tolerance=1e6).ok     # any token is within 2e6
