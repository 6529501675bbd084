"""The disk cache: a second process loads the compiled program instead of compiling; an edit invalidates it;
only a folder and entries of the user's own, not writable by others, are trusted."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import pypto.language as pl
from pypto_rt import config
from pypto_rt import disk_cache

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


def run(tmp_path, factor: str, then: str = "") -> str:
    """Run SCRIPT (with `then` appended) in a fresh process using tmp_path's cache; its output."""
    script = tmp_path / "prog.py"
    script.write_text(f"FACTOR = {factor}\n" + SCRIPT + textwrap.dedent(then))
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


def test_a_program_loaded_from_the_cache_runs_under_pypto_check(tmp_path):
    """PYPTO_CHECK=reference compares each region with the op library. Turned on in a process that already loaded
    the program from the disk cache (which keeps its regions' code, not their bodies), it checks that program as
    it checks one compiled now."""
    assert run(tmp_path, "2.0") == "compiled"
    assert run(tmp_path, "2.0", then="""
        from pypto_rt import config
        with config.scope(CHECK="reference"):
            assert torch.equal(scale(x), x * FACTOR), "wrong result under PYPTO_CHECK"
        print("checked")
    """).split() == ["loaded", "checked"]


# ---------------------------------------------------------------------------------------------- trust (in-process)
# The suite runs as root: a foreign owner is uid 65534. A "poisoned" entry is times2's program stored under
# times3's entry name: a cache that trusts it makes times3 multiply by 2.

FOREIGN_UID = 65534


@pl.jit
def times2(x: pl.Tensor[[16, 8], pl.FP32], y: pl.Out[pl.Tensor[[16, 8], pl.FP32]]):
    for r in pl.parallel(0, 16, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="times"):
            y[r : r + 8, :] = pl.mul(x[r : r + 8, :], 2.0)
    return y


@pl.jit
def times3(x: pl.Tensor[[16, 8], pl.FP32], y: pl.Out[pl.Tensor[[16, 8], pl.FP32]]):
    for r in pl.parallel(0, 16, 8):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="times"):
            y[r : r + 8, :] = pl.mul(x[r : r + 8, :], 3.0)
    return y


X = torch.arange(128, dtype=torch.float32).reshape(16, 8)


def run_in(folder, kernel) -> torch.Tensor:
    """kernel(X) with a fresh in-memory program, so the disk cache at `folder` is asked."""
    kernel.state.clear()
    with config.scope(CACHE_DIR=str(folder)):
        return kernel(X)


def entry_of(kernel, folder) -> str:
    """Path of the entry `kernel` stores in a fresh `folder`."""
    run_in(folder, kernel)
    (name,) = os.listdir(folder)
    return os.path.join(folder, name)


@pytest.fixture
def poison(tmp_path):
    """(times3's entry name, a file holding times2's entry): what a planted entry would be."""
    own = entry_of(times3, tmp_path / "own")
    other = entry_of(times2, tmp_path / "other")
    assert open(own, "rb").read() != open(other, "rb").read()
    return os.path.basename(own), other


@pytest.fixture
def cache_warnings(monkeypatch):
    """The disk-cache warnings raised meanwhile (the once-per-folder memory starts empty)."""
    monkeypatch.setattr(disk_cache, "_warned", set(), raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield lambda: [str(w.message) for w in caught if "pypto-rt disk cache" in str(w.message)]


def plant(folder, name, source) -> None:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    shutil.copyfile(source, os.path.join(folder, name))
    os.chmod(os.path.join(folder, name), 0o600)


@pytest.mark.parametrize("unsafe", ["foreign_owner", "world_writable"])
def test_an_unsafe_cache_folder_is_not_used_and_warns_once(tmp_path, poison, cache_warnings, unsafe):
    name, poisoned = poison
    folder = tmp_path / "planted"
    plant(folder, name, poisoned)
    if unsafe == "foreign_owner":
        os.chown(folder / name, FOREIGN_UID, FOREIGN_UID)
        os.chown(folder, FOREIGN_UID, FOREIGN_UID)
    else:
        os.chmod(folder, 0o777)
    assert torch.equal(run_in(folder, times3), X * 3)
    assert torch.equal(run_in(folder, times2), X * 2)
    assert os.listdir(folder) == [name]                  # nothing written there either
    why = f"owned by uid {FOREIGN_UID}, not by you" if unsafe == "foreign_owner" else "writable by group or others"
    (warning,) = cache_warnings()
    assert f"pypto-rt disk cache {folder}: the folder is {why}" in warning
    assert "so the disk cache is not used" in warning


@pytest.mark.parametrize("planted", ["symlink", "foreign_owner", "world_writable"])
def test_an_untrusted_entry_is_ignored_and_replaced(tmp_path, poison, cache_warnings, planted):
    name, poisoned = poison
    folder = tmp_path / "cache"
    os.makedirs(folder, mode=0o700)
    if planted == "symlink":
        os.symlink(poisoned, folder / name)                # a file of the user's own, elsewhere
    else:
        plant(folder, name, poisoned)
        if planted == "foreign_owner":
            os.chown(folder / name, FOREIGN_UID, FOREIGN_UID)
        else:
            os.chmod(folder / name, 0o666)
    before = open(poisoned, "rb").read()
    assert torch.equal(run_in(folder, times3), X * 3)
    st = os.lstat(folder / name)                           # the store replaced it with the user's own entry
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert open(poisoned, "rb").read() == before
    assert torch.equal(run_in(folder, times3), X * 3)    # and that entry loads
    (warning,) = cache_warnings()
    assert f"ignoring entry {name}" in warning


def test_a_symlink_planted_at_the_temporary_path_is_not_followed(tmp_path, poison, cache_warnings, monkeypatch):
    name, _ = poison
    folder = tmp_path / "cache"
    os.makedirs(folder, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    monkeypatch.setattr(disk_cache, "_temp_name", lambda entry: entry + ".planted.tmp", raising=False)
    for temp in (f"{name}.planted.tmp", f"{name}.{os.getpid()}.tmp"):   # this version's and the old fixed name
        os.symlink(victim, folder / temp)
    assert torch.equal(run_in(folder, times3), X * 3)
    assert victim.read_bytes() == b"the user's file"
    assert not os.path.exists(folder / name)              # nothing stored through the planted link
    (warning,) = cache_warnings()
    assert f"something is already at {folder / name}.planted.tmp" in warning


def test_folders_and_entries_the_cache_creates_are_private(tmp_path, cache_warnings):
    folder = tmp_path / "a" / "b" / "cache"
    assert torch.equal(run_in(folder, times3), X * 3)
    for path in (tmp_path / "a", tmp_path / "a" / "b", folder):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
    (entry,) = os.listdir(folder)
    assert stat.S_IMODE(os.stat(folder / entry).st_mode) == 0o600
    assert cache_warnings() == []


def test_a_subfolder_for_another_tools_cache_is_private_and_only_in_a_trusted_folder(tmp_path, cache_warnings):
    folder = tmp_path / "cache"
    with config.scope(CACHE_DIR=str(folder)):
        sub = disk_cache.private_subfolder("inductor")   # (replay.tier: the torch compiler's own cache)
    assert sub == str(folder / "inductor") and stat.S_IMODE(os.stat(sub).st_mode) == 0o700
    os.chmod(sub, 0o777)   # another user could plant code the tool loads
    with config.scope(CACHE_DIR=str(folder)):
        assert disk_cache.private_subfolder("inductor") is None
    assert len(cache_warnings()) == 1
    with config.scope(CACHE_DIR="off"):
        assert disk_cache.private_subfolder("inductor") is None
