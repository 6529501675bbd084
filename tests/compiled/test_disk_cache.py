"""The disk cache: a second process loads the compiled program instead of compiling; an edit invalidates it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import torch
    import pypto.language as pl
    from pypto_rt.orchestration.program import host_program

    @pl.jit
    def scale(x: pl.Tensor[[16, 8], pl.FP32], y: pl.Out[pl.Tensor[[16, 8], pl.FP32]]):
        for r in pl.parallel(0, 16, 8):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
                y[r : r + 8, :] = pl.mul(x[r : r + 8, :], FACTOR)
        return y

    x = torch.arange(128, dtype=torch.float32).reshape(16, 8)
    y = scale(x)
    assert torch.equal(y, x * FACTOR), "wrong result"
    print("loaded" if host_program(scale).ir is None else "compiled")
''')


def run(tmp_path, factor: str) -> str:
    script = tmp_path / "prog.py"
    script.write_text(f"FACTOR = {factor}\n" + SCRIPT)
    env = dict(os.environ, PYPTO_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_second_process_loads_the_program_and_an_edit_recompiles(tmp_path):
    assert run(tmp_path, "2.0") == "compiled"
    assert run(tmp_path, "2.0") == "loaded"
    assert len(os.listdir(tmp_path / "cache")) == 1
    script = tmp_path / "prog.py"
    script.write_text(script.read_text().replace("pl.mul(x[r : r + 8, :], FACTOR)",
                                                 "pl.add(pl.mul(x[r : r + 8, :], FACTOR), 0.0)"))
    edited = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYPTO_CACHE_DIR=str(tmp_path / "cache")))
    assert edited.returncode == 0, edited.stderr
    assert edited.stdout.strip() == "compiled"
    assert run(tmp_path, "3.0") == "loaded"     # a module constant is read at run time, not baked in


def test_cache_off_always_compiles(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("FACTOR = 2.0\n" + SCRIPT)
    env = dict(os.environ, PYPTO_CACHE_DIR="off")
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "compiled"
