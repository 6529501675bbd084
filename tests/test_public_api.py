"""The embedding API, used only through `pypto_rt`'s public names: Runtime, Options, RunResult, RunStats."""
from __future__ import annotations

import contextvars
import subprocess
import sys
import threading

import pytest
import torch

import pypto.language as pl
import pypto_rt
from pypto_rt.errors import PyptoError

ROWS, COLS, TILE = 32, 16, 8


@pl.jit
def add_rows(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Tensor[[ROWS, COLS], pl.FP32],
             out: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for r in pl.parallel(0, ROWS, TILE):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add"):
            out[r : r + TILE, :] = pl.add(x[r : r + TILE, :], y[r : r + TILE, :])
    return out


@pytest.fixture(autouse=True)
def _environment_defaults(monkeypatch):
    for name in ("PYPTO_EXECUTOR", "PYPTO_NUM_WORKERS", "PYPTO_REPLAY", "PYPTO_COALESCE", "PYPTO_STATS"):
        monkeypatch.delenv(name, raising=False)


def _inputs():
    return torch.randn(ROWS, COLS), torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)


def test_run_returns_the_outputs_and_the_stats():
    rt = pypto_rt.Runtime(num_workers=2, replay=False)
    x, y, out = _inputs()
    result = rt.run(add_rows, x, y, out)
    assert isinstance(result, pypto_rt.RunResult) and isinstance(result.stats, pypto_rt.RunStats)
    assert result.outputs is out and torch.equal(out, x + y)
    assert result.stats.tasks > 0 and result.stats.engine["workers"] == 2
    assert result.stats.wall_ns > 0


def test_an_options_override_holds_for_its_block_only():
    rt = pypto_rt.Runtime(replay=False)
    x, y, _ = _inputs()
    seen = {}
    with rt.options(executor="reference"):
        reference = rt.run(add_rows, x, y, torch.zeros(ROWS, COLS))
        seen["inside"] = pypto_rt.Options.current().executor
        started = threading.Thread(target=lambda: seen.update(thread=pypto_rt.Options.current().executor))
        copied = contextvars.copy_context()
        started.start()
        started.join(10)
        seen["copied"] = copied.run(lambda: pypto_rt.Options.current().executor)
    compiled = rt.run(add_rows, x, y, torch.zeros(ROWS, COLS))
    assert torch.equal(reference.outputs, compiled.outputs)
    assert reference.stats.tasks == 0 and compiled.stats.tasks > 0   # the reference executor runs no engine
    assert seen == {"inside": "reference", "thread": "compiled", "copied": "reference"}
    assert pypto_rt.Options.current().executor == "compiled"


def test_compile_then_call_runs_with_the_config_given():
    x, y, out = _inputs()
    add_rows(x, y, out)   # compiled coalesced first: the config's coalesce=False must still hold for the entry
    on_engine = add_rows.compile(x, y, out, config={"replay": False, "coalesce": False})
    on_oracle = add_rows.compile(x, y, out, config=pypto_rt.Options(executor="reference"))
    rt = pypto_rt.default_runtime()
    engine_run = rt.run(on_engine, x, y, out)
    assert torch.equal(out, x + y) and engine_run.stats.tasks == ROWS // TILE   # one task per tile: coalesce off
    out.zero_()
    assert rt.run(on_oracle, x, y, out).stats.tasks == 0 and torch.equal(out, x + y)


def test_compile_and_the_compiled_entry_check_the_arguments_as_a_call_does():
    x, y, out = _inputs()
    with pytest.raises(PyptoError, match="argument 'x' must be a torch.Tensor, got str"):
        add_rows.compile("x", y, out)
    compiled = add_rows.compile(x, y, out)
    with pytest.raises(PyptoError, match="too many positional arguments"):
        compiled(x, y, out, out)


def test_two_runtimes_keep_their_own_workers():
    one, two = pypto_rt.Runtime(num_workers=1, replay=False), pypto_rt.Runtime(num_workers=2, replay=False)
    x, y, out = _inputs()
    assert one.run(add_rows, x, y, out).stats.engine["workers"] == 1
    assert two.run(add_rows, x, y, out).stats.engine["workers"] == 2
    assert (one.worker_pool_size, two.worker_pool_size) == (1, 2)   # the second did not replace the first's pool
    with one:   # a plain call inside `with rt:` uses that runtime
        with pypto_rt.Runtime(num_workers=3, replay=False) as three:
            add_rows(x, y, out)
    assert three.worker_pool_size == 3 and torch.equal(out, x + y)
    for rt in (one, two, three):
        rt.close()


def test_options_say_which_value_is_wrong():
    with pytest.raises(PyptoError, match=r"Options\(num_workers=...\): PYPTO_NUM_WORKERS='0' must be an integer"):
        pypto_rt.Options(num_workers=0)
    with pytest.raises(PyptoError, match="unknown option 'workers'"):
        pypto_rt.Runtime().options(workers=2).__enter__()


def test_options_are_the_user_knobs():
    from pypto_rt import knobs
    fields = set(pypto_rt.Options.__dataclass_fields__)
    assert {f"PYPTO_{name.upper()}" for name in fields} == {k.env for k in knobs.ALL if k.audience == knobs.USER}


def test_deterministic_mode_is_an_option_too():
    with pypto_rt.default_runtime().options(deterministic=True):
        assert pypto_rt.are_deterministic_algorithms_enabled()
    assert pypto_rt.Options.current().deterministic == pypto_rt.are_deterministic_algorithms_enabled()


def test_the_public_names_are_documented_and_cheap_to_import():
    for name in pypto_rt.__all__:
        assert getattr(pypto_rt, name).__doc__, name
    code = "import sys, pypto_rt; pypto_rt.Options; pypto_rt.RunStats; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
