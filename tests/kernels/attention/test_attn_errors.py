"""The attention kernels' argument checks have one public home (`attn_errors`): the entry points and the contiguous
baseline of benchmark 14 use it (no benchmark or example reaches for a kernel library's private names), and each check
names the argument and points at the caller's line."""
import ast
import pathlib

import pytest
import torch

from pypto_rt.kernels.attention import attn_errors
from pypto_rt.kernels.attention.attn_errors import AttentionArgumentError

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _private_kernel_imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.name}:{node.lineno} {alias.name}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pypto_rt.kernels")
            for alias in node.names if alias.name.startswith("_")]


def test_no_benchmark_or_example_imports_a_kernel_librarys_private_names():
    found = [hit for folder in ("bench", "examples") for path in sorted((ROOT / folder).rglob("*.py"))
             for hit in _private_kernel_imports(path)]
    assert found == []


def test_the_checks_name_the_argument_and_point_at_the_callers_line():
    key, cache = torch.zeros(2, 1, 4), torch.zeros(3, 4, 1, 4)
    cases = [(lambda: attn_errors.check_caches(cache, cache[:1], torch.float32), "value_cache is torch.float32"),
             (lambda: attn_errors.check_caches(cache, cache, torch.bfloat16), "key_cache is torch.float32"),
             (lambda: attn_errors.check_int("positions", torch.zeros(2), [2]), "positions is torch.float32 \\[2\\]"),
             (lambda: attn_errors.check_new_rows(key, key[:1], "B"), "value is torch.float32 \\[1, 1, 4\\]"),
             (lambda: attn_errors.fail("out", key, "something else"), "out is .*; it must be something else")]
    for check, message in cases:
        with pytest.raises(AttentionArgumentError, match=message) as raised:
            check()
        assert raised.value.span is not None and raised.value.span.file == __file__, raised.value.span
    attn_errors.check_caches(cache, cache.clone(), torch.float32)
    attn_errors.check_int("slots", torch.zeros(2, dtype=torch.int64), [2], (torch.int64,))
    attn_errors.check_new_rows(key, key.clone(), "B")
