"""Small modules with one job (house style): no module over 500 lines, no function over 60 lines.

Counts the runtime's own code (pypto_rt/, launch/ which installs as pypto_rt.launch, and the pypto shim).
A module or function that grows past a bound is split by job, not exempted here.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("pypto_rt", "launch", "pypto")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _sources():
    for package in PACKAGES:
        for root, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    yield os.path.relpath(path, ROOT), open(path).read()


def test_no_module_over_500_lines():
    big = {path: text.count("\n") for path, text in _sources() if text.count("\n") > MAX_MODULE_LINES}
    assert big == {}


def test_no_function_over_60_lines():
    long = {}
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path}:{node.lineno} {node.name}"] = lines
    assert long == {}
