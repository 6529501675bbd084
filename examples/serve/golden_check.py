"""The flagship's golden check: every served request's tokens against `GoldenDecoder` (one process, eager torch,
one request at a time over a contiguous cache).

The golden is teacher-forced with the served tokens: at output position i it reads the prompt and the served
tokens before i and gives its logits. With `tolerance` 0 (FP32) the served token must be the golden's greedy
token (argmax, lowest id on ties), so every request equals `GoldenDecoder.generate` token for token. With a
tolerance (bf16, int8 experts) the served model's logits may differ from the golden's by up to `tolerance`, so
its greedy token may be any whose golden logit is within 2 x tolerance of the golden's top logit; a token
outside that margin, or a wrong number of tokens, fails.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pypto_rt.serving.model.golden import GoldenDecoder, RequestCache


@dataclass(frozen=True)
class RequestVerdict:
    request_id: int
    ok: bool
    detail: str = ""        # where and how a failing request differs


def check_request(golden: GoldenDecoder, request_id: int, prompt: Sequence[int], served: Sequence[int],
                  expected_len: int, tolerance: float = 0.0) -> RequestVerdict:
    """One request's served tokens against the golden (see the module docstring)."""
    if len(served) != expected_len:
        return RequestVerdict(request_id, False, f"served {len(served)} tokens, expected {expected_len}")
    cache, ids = RequestCache(golden.cfg), list(prompt)
    for pos, token in enumerate(served):
        logits = golden.step(cache, ids)
        best = int(logits.argmax())
        gap = float(logits[best] - logits[token]) if 0 <= token < logits.shape[0] else float("inf")
        if (token != best) if tolerance == 0 else gap > 2 * tolerance:
            return RequestVerdict(request_id, False, f"output token {pos}: served {token}, golden {best} "
                                  f"(golden logit gap {gap:.4g}, allowed {2 * tolerance:.4g})")
        ids = [int(token)]
    return RequestVerdict(request_id, True)


def check_all(golden: GoldenDecoder, served: dict[int, tuple[Sequence[int], Sequence[int], int]],
              tolerance: float = 0.0) -> list[RequestVerdict]:
    """served: request id -> (prompt, served tokens, max_new_tokens); verdicts in request-id order."""
    return [check_request(golden, rid, prompt, tokens, expected, tolerance)
            for rid, (prompt, tokens, expected) in sorted(served.items())]
