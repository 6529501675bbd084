"""The compiled tier works around inductor's own bugs by compiling once more with other settings: an RMSNorm that
writes its residual in place made torch 2.13's C++ outer-loop fusion raise KeyError: 'buf4' (a fused buffer whose
user writes it has no load of it); the retry compiles it without fusing, and the trial keeps the faster."""
import gc

import torch

from pypto_rt import config
from pypto_rt.kernels.layers import rms_norm
from pypto_rt.kernels.layers.golden import rms_norm_golden
from pypto_rt.replay.policy import ReplayPolicy
from pypto_rt.replay.tier import FAILED, Tier

# the engine runs, the recording, the replay's trial, the compile at the first replay and the compiled call's trial
CALLS = ReplayPolicy().normal_runs + 2 + 2 * (ReplayPolicy().trial_replays + 1) + 2 * ReplayPolicy().tier_trial_calls


def test_an_in_place_residual_norm_that_inductor_failed_to_fuse_is_compiled_without_fusing():
    gen = torch.Generator().manual_seed(5)
    x, weight = torch.randn(8, 256, generator=gen), torch.randn(256, generator=gen)
    start = torch.randn(8, 256, generator=gen)
    with config.scope(EXECUTOR="compiled", TIER="eager"):
        for _ in range(CALLS):
            residual = start.clone()
            out = rms_norm(x, weight, 1e-6, residual=residual)
            torch.testing.assert_close(residual, x + start)
            torch.testing.assert_close(out, rms_norm_golden(x + start, weight, 1e-6))
    built = [t for t in gc.get_objects() if type(t) is Tier and "add_rms_norm" in t.entry and
             (t.state == FAILED or t.tiered is not None)]
    assert built and all(t.state != FAILED for t in built), [t.text for t in built]
