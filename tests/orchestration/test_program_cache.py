"""The disk cache's key for compiled host programs (orchestration.program_cache)."""
from __future__ import annotations

import os
import types

import pytest

from pypto_rt.orchestration import program_cache


@pytest.mark.parametrize("source", ["ops/distributed.py", "incore_compiler/accesses.py"])
def test_an_edit_of_the_compiler_or_the_op_library_changes_the_key(monkeypatch, source):
    # an op's declared facts (what it writes, its result shape, its coalescing) shape generated code and access
    # plans: entries compiled before an edit of pypto_rt/ops must miss, as for the compiler's own packages
    monkeypatch.setattr(program_cache, "_compiler_stamp", None)
    before = program_cache._stamp()
    real = os.stat

    def edited(path, *args, **kwargs):
        st = real(path, *args, **kwargs)
        if str(path).replace(os.sep, "/").endswith("pypto_rt/" + source):
            return types.SimpleNamespace(st_size=st.st_size + 1, st_mtime_ns=st.st_mtime_ns + 1)
        return st

    monkeypatch.setattr(os, "stat", edited)
    monkeypatch.setattr(program_cache, "_compiler_stamp", None)
    assert program_cache._stamp() != before
