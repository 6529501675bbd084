"""Imports point one way (house style 7.1): errors/config <- language <- ops <- executors <- harness/CLI.

The compiled runtime: frontend <- incore_compiler <- orchestration (which drives the aicpu engine); the
driver reaches orchestration through one deferred import.
"""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "pypto_rt")
INSTALLED = ("pypto_rt", "launch", "kernels")   # launch/ and kernels/ are installed as pypto_rt.launch, .kernels

# package -> pypto_rt packages it must never import (at module level or inside functions)
FORBIDDEN = {
    "language": {"ops", "reference", "golden", "binding", "pypto_run"},
    "ops": {"reference", "golden", "driver", "binding", "pypto_run"},
    "reference": {"golden", "driver", "pypto_run"},
    "golden": {"reference", "ops", "binding", "frontend", "incore_compiler", "orchestration", "aicpu"},
    # the compiled runtime: frontend -> incore_compiler -> orchestration, with the engine (aicpu) below them all
    "aicpu": {"language", "ops", "reference", "golden", "driver", "binding", "frontend", "incore_compiler",
              "orchestration", "pypto_run"},
    "frontend": {"ops", "reference", "golden", "driver", "binding", "incore_compiler", "orchestration", "aicpu"},
    "incore_compiler": {"golden", "driver", "orchestration", "aicpu", "pypto_run"},
    "orchestration": {"golden", "driver", "pypto_run"},
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


# the same name in two layers for one idea seen from each side (the reason says why it is one idea), or on its way out
SHARED_NAMES = {
    "distributed.py": "the pld surface (language) and the semantics of its ops (ops), as pl stubs and pl ops",
    "torch_backend.py": "each layer's torch backend: kernels as torch code, communicators on torch.distributed",
    "config.py": "the runtime's knobs and pypto-launch's validated flags",
    "files.py": "kernel-library files as modules (golden) and the launcher's log folder (launch)",
    "Refused": "a run replay refuses (moving to pypto_rt/replay) and a peer the launch gateway refuses",
}


def _installed_modules():
    for top in INSTALLED:
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            yield from (os.path.relpath(os.path.join(root, f), ROOT) for f in files
                        if f.endswith(".py") and f != "__init__.py")


def _shared(names_by_module) -> dict:
    seen: dict[str, list[str]] = {}
    for module, name in names_by_module:
        seen.setdefault(name, []).append(module)
    return {name: sorted(where) for name, where in seen.items() if len(where) > 1 and name not in SHARED_NAMES}


def test_module_names_say_which_layer():
    """Two modules with one file name in different layers (two executor.py, shm.py, rendezvous.py) read as one."""
    assert _shared((m, os.path.basename(m)) for m in _installed_modules()) == {}


def test_class_names_say_which_layer():
    """Two public classes with one name (the engine's and the front end's Region) read as one idea; they are not."""
    classes = ((m, node.name) for m in _installed_modules()
               for node in ast.parse(open(os.path.join(ROOT, m)).read()).body
               if isinstance(node, ast.ClassDef) and not node.name.startswith("_"))
    assert _shared(classes) == {}
