"""Imports point one way (house style 7.1): errors/config <- language <- ops <- executors <- harness/CLI.

The compiled runtime: frontend <- incore_compiler <- orchestration (which drives the aicpu engine); the
driver reaches orchestration through one deferred import. Replay sits on ops and below orchestration.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pypto_rt")

# package -> pypto_rt packages it must never import (at module level or inside functions)
FORBIDDEN = {
    "language": {"ops", "reference", "golden", "binding", "pypto_run"},
    # the op library is the semantic oracle: replay reaches it, never the reverse (ops.recording is its hook)
    "ops": {"reference", "golden", "driver", "binding", "pypto_run", "replay", "orchestration"},
    "reference": {"golden", "driver", "pypto_run"},
    "golden": {"reference", "ops", "binding", "frontend", "incore_compiler", "orchestration", "aicpu"},
    # the compiled runtime: frontend -> incore_compiler -> orchestration, with the engine (aicpu) below them all
    "aicpu": {"language", "ops", "reference", "golden", "driver", "binding", "frontend", "incore_compiler",
              "orchestration", "pypto_run"},
    "frontend": {"ops", "reference", "golden", "driver", "binding", "incore_compiler", "orchestration", "aicpu"},
    "incore_compiler": {"golden", "driver", "orchestration", "aicpu", "pypto_run"},
    "orchestration": {"golden", "driver", "pypto_run"},
    # replay records and reruns what orchestration runs: orchestration imports it, not the reverse
    "replay": {"orchestration", "driver", "golden", "pypto_run"},
    # communicators sit beside the engine, below everything else: only errors and config from pypto_rt
    "collective": {"language", "ops", "reference", "golden", "driver", "binding", "frontend", "incore_compiler",
                   "orchestration", "aicpu", "pypto_run", "launch", "kernels"},
}
# sanctioned upward edges: KernelFunction.__call__/compile reach the driver; pld reaches the op library
ALLOWED = {("language/decorators.py", "driver"),
           # pld's plain-Python half: window views need the dtype -> torch storage mapping, and collectives called
           # outside any kernel run on the op library directly (there is no executor to dispatch through)
           ("language/distributed.py", "ops")}


def _imports(path):
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pypto_rt"):
            parts = node.module.split(".")
            if len(parts) > 1:
                yield parts[1]
            else:
                yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pypto_rt."):
                    yield alias.name.split(".")[1]


def _modules():
    for package in FORBIDDEN:
        for root, _, files in os.walk(os.path.join(PKG, package)):
            for f in files:
                if f.endswith(".py"):
                    yield package, os.path.relpath(os.path.join(root, f), PKG)


@pytest.mark.parametrize("package,module", sorted(_modules()))
def test_imports_point_down(package, module):
    bad = {target for target in _imports(os.path.join(PKG, module))
           if target in FORBIDDEN[package] and (module, target) not in ALLOWED}
    assert bad == set(), f"{module} imports {sorted(bad)}"


def test_modules_stay_under_the_hard_size_cap():
    big = []
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                n = sum(1 for _ in open(path))
                if n > 800:
                    big.append((os.path.relpath(path, PKG), n))
    assert big == []


def test_the_op_library_loads_without_the_replay_layer():
    """ops talks to a recording only through ops.recording: importing it (and using it) loads no replay module."""
    code = ("import sys, pypto_rt.ops, pypto_rt.ops.recording; "
            "print(sorted(m for m in sys.modules if m.startswith(('pypto_rt.replay', 'pypto_rt.orchestration'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
