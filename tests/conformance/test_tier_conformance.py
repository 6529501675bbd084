"""The conformance kernels give the same results with the compiled tier on (issue 17, PYPTO_TIER=eager).

Each single-rank kernel (c01-c07; c08/c09 are multi-rank programs: compiled communicating replays are checked by
tests/replay/test_tier_segments.py on MoE dispatch and combine) runs through the
golden harness (`run_jit`, fresh random inputs per call, the kernel's own tolerance) until its replay is compiled,
then again with every specialisation made to run its compiled function, so the calls checked are compiled calls.

Budget: a compile is 0.1-2 s from inductor's disk cache and 5-75 s cold on this 2-core machine (the matmul kernels
the longest). The suite's scratch cache starts cold, so these tests keep inductor's cache where the benchmarks
and users keep it (`~/.cache/pypto-rt/inductor`, the default PYPTO_CACHE_DIR's): the first run on a machine pays the
cold compiles once (minutes here), later runs a few seconds per kernel.
"""
from __future__ import annotations

import inspect
import os

import pytest

from pypto_rt import config
from pypto_rt.golden import run_jit
from pypto_rt.golden.files import kernel_entry, load_kernel_file
from pypto_rt.replay.policy import policy_scope
from pypto_rt.replay.tier import tiers

HERE = os.path.dirname(os.path.abspath(__file__))
# (file, tolerance as its own run_jit call gives it, build_specs arguments)
KERNELS = [
    ("c01_masked_softmax", 1e-5, ()),
    ("c02_matmul_bf16_bt", 1e-2, ()),
    ("c03_rmsnorm_dynamic", 2e-2, (128,)),
    ("c04_swiglu_inline", 2e-2, ()),
    ("c05_layernorm_program", 1e-4, ()),
    ("c06_paged_kv_append", 0.0, ()),
    ("c07_w8a8_swiglu", 1e-2, ()),
]
WARM, CHECKED = 8, 4   # calls until the replay is compiled (eager: at its first replay); compiled calls checked
# keep the replay (no engine trial), compile at the first replay; the tier's trial never ends (forced below)
KEEP = dict(slower=float("inf"), parallel=float("inf"), trial_replays=0, tier_trial_calls=1 << 30,
            tier_after_replays=0)


@pytest.fixture(scope="module", autouse=True)
def inductor_disk_cache():
    """Inductor's cache where the benchmarks keep it (the default PYPTO_CACHE_DIR's), for this module only."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    where = os.path.join(os.path.expanduser("~"), ".cache", "pypto-rt", "inductor")   # (disk_cache.folder's default)
    os.makedirs(where, mode=0o700, exist_ok=True)
    with temporary_cache_dir(where):
        yield


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name, tolerance, sizes", KERNELS, ids=[k[0] for k in KERNELS])
def test_a_conformance_kernel_gives_its_golden_results_when_compiled(name, tolerance, sizes):
    module = load_kernel_file(os.path.join(HERE, f"{name}.py"), f"{name}_tiered")
    entry = kernel_entry(module)
    golden = next(v for k, v in vars(module).items() if k.startswith("golden_") and callable(v))

    def check(call: int) -> None:
        result = run_jit(fn=entry, specs=module.build_specs(*sizes), golden_fn=golden,
                         runtime_cfg=dict(platform="cpu"), rtol=tolerance, atol=tolerance)
        assert result.passed, f"{name}, call {call}: {result.error}"
    with config.scope(TIER="eager", EXECUTOR="compiled"), policy_scope(**KEEP):
        for call in range(WARM):
            check(call)
        found = tiers(entry)
        assert found and all(t.tiered is not None for t in found), [t.text for t in found]
        for t in found:
            t.chosen = t.tiered   # (every call runs the compiled function from here)
        for call in range(WARM, WARM + CHECKED):
            check(call)


@pytest.mark.timeout(600)
def test_the_golden_harness_repeating_calls_checks_compiled_calls_against_the_golden(capsys):
    """What a user runs to check a kernel with the tier on: `PYPTO_TIER=eager PYPTO_GOLDEN_REPEAT=6 pypto-run
    k.py`, the default policy but for the engine trial (kept replay): engine, engine, recorded, then from the first
    replay (compiled there and run) compiled and replayed calls alternate in the tier's trial, each call checked."""
    module = load_kernel_file(os.path.join(HERE, "c01_masked_softmax.py"), "c01_repeated")
    entry = kernel_entry(module)
    with config.scope(TIER="eager", EXECUTOR="compiled", GOLDEN_REPEAT="6"), \
            policy_scope(slower=float("inf"), parallel=float("inf")):
        result = run_jit(fn=entry, specs=module.build_specs(), golden_fn=module.golden_masked_softmax,
                         runtime_cfg=dict(platform="cpu"), rtol=1e-5, atol=1e-5)
    assert result.passed, result.error
    (tier,) = tiers(entry)
    compiled_calls, replayed_calls = tier.trial_ns
    # call 4 built it and ran it; calls 5 and 6: compiled, then replayed, timed in the trial
    assert tier.state == "trial" and (len(compiled_calls), len(replayed_calls)) == (1, 1), tier.text
    assert capsys.readouterr().out.count("'y' PASS") == 6
