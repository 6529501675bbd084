"""PYPTO_GOLDEN_REPEAT=N: the harness calls the kernel N times, each call on fresh inputs and checked against the
golden, so a kernel's steady state (its replayed, and with PYPTO_TIER=eager compiled, calls) is checked too
(the compiled case: tests/conformance/test_tier_conformance.py)."""
from __future__ import annotations

import pytest
import torch

from pypto_rt import config
from pypto_rt.errors import PyptoError
from pypto_rt.golden import TensorSpec, run_jit


def specs():
    return [TensorSpec("x", [4, 8], torch.float32, init_value=torch.randn),
            TensorSpec("y", [4, 8], torch.float32, is_output=True)]


def golden(values):
    values["y"][:] = values["x"] * 2


def test_every_call_gets_fresh_inputs_and_is_checked(capsys):
    seen = []

    def kernel(x, y):
        seen.append(x.clone())
        y[:] = x * 2
    with config.scope(GOLDEN_REPEAT="3"):
        result = run_jit(kernel, specs(), golden_fn=golden)
    assert result.passed, result.error
    assert len(seen) == 3 and not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    out = capsys.readouterr().out.splitlines()
    assert [ln for ln in out if ln.startswith("[RUN] call ")] == [
        f"[RUN] call {i} of 3 (PYPTO_GOLDEN_REPEAT)" for i in (1, 2, 3)]
    assert sum(ln == "[RUN]   'y' PASS  shape=(4, 8) dtype=torch.float32" for ln in out) == 3
    assert out[-1].startswith("[RUN] PASS (") and out[-1].endswith(", 3 calls)")


def test_a_later_call_that_differs_fails_the_run_naming_the_call():
    calls = []

    def kernel(x, y):   # right twice, then wrong: what a broken replay or compiled call would look like
        calls.append(1)
        y[:] = x * 2 if len(calls) < 3 else x * 3
    with config.scope(GOLDEN_REPEAT="4"):
        result = run_jit(kernel, specs(), golden_fn=golden)
    assert not result.passed and len(calls) == 3   # (stops at the first call that does not match)
    assert result.error.startswith("call 3 of 4: Output(s) does not match golden: ['y']"), result.error


def test_one_call_by_default_and_a_bad_count_is_an_error_naming_the_variable(capsys):
    calls = []
    assert run_jit(lambda x, y: calls.append(y.copy_(x * 2)), specs(), golden_fn=golden).passed
    assert len(calls) == 1 and "[RUN] call " not in capsys.readouterr().out
    with config.scope(GOLDEN_REPEAT="0"), pytest.raises(PyptoError, match="PYPTO_GOLDEN_REPEAT='0' must be an "
                                                                             "integer >= 1"):
        run_jit(lambda x, y: None, specs(), golden_fn=golden)
