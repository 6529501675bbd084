"""Imports point one way (house style 7.1): errors/config <- language <- ops <- executors <- harness/CLI.

The compiled runtime: frontend <- incore_compiler <- orchestration (which drives the aicpu engine); the
driver reaches orchestration, and the host form (host_form: forked ranks, their store and messages), through
deferred imports. Replay sits on ops and below orchestration. The disk cache stores what its caller gives it and
imports only config and errors.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "pypto_rt")
INSTALLED = ("pypto_rt", "launch", "kernels")   # launch/ and kernels/ are installed as pypto_rt.launch, .kernels

# package -> pypto_rt packages it must never import (at module level or inside functions)
FORBIDDEN = {
    # the surface reaches the runtime only through the driver's entry (ALLOWED below)
    "language": {"ops", "reference", "golden", "binding", "pypto_run", "host_form", "frontend", "incore_compiler",
                 "orchestration", "aicpu", "replay", "disk_cache", "executor_base", "runtime", "options", "driver"},
    # the op library is the semantic oracle: replay reaches it, never the reverse (ops.recording is its hook)
    "ops": {"reference", "golden", "driver", "binding", "pypto_run", "host_form", "replay", "orchestration"},
    # the oracle depends on no part of the compiled runtime; the product executors share executor_base with it
    "reference": {"golden", "driver", "pypto_run", "host_form", "incore_compiler", "orchestration", "aicpu",
                  "collective", "disk_cache"},
    "golden": {"reference", "ops", "binding", "frontend", "incore_compiler", "orchestration", "aicpu", "host_form"},
    # the compiled runtime: frontend -> incore_compiler -> orchestration, with the engine (aicpu) below them all
    "aicpu": {"language", "ops", "reference", "golden", "driver", "binding", "frontend", "incore_compiler",
              "orchestration", "pypto_run", "host_form", "disk_cache"},
    "frontend": {"ops", "reference", "golden", "driver", "binding", "incore_compiler", "orchestration", "aicpu",
                 "host_form", "disk_cache"},
    "incore_compiler": {"golden", "driver", "orchestration", "aicpu", "pypto_run", "host_form", "disk_cache",
                        "reference"},
    "orchestration": {"golden", "driver", "pypto_run", "host_form", "reference"},
    # replay records and reruns what orchestration runs: orchestration imports it, not the reverse
    "replay": {"orchestration", "driver", "golden", "pypto_run", "host_form", "disk_cache", "reference"},
    # the host form runs a host body eagerly and its dispatches on forked ranks, under either executor: it knows
    # nothing of the compiled runtime (a rank reaches it through the kernel's own call, i.e. the driver)
    "host_form": {"golden", "driver", "binding", "pypto_run", "frontend", "incore_compiler", "orchestration",
                  "disk_cache", "launch", "kernels"},
    # communicators sit beside the engine, below everything else: only errors and config from pypto_rt
    "collective": {"language", "ops", "reference", "golden", "driver", "binding", "frontend", "incore_compiler",
                   "orchestration", "aicpu", "pypto_run", "launch", "kernels", "host_form", "disk_cache"},
}
# modules that import nothing from pypto_rt but these
ONLY = {"disk_cache.py": {"config", "errors"},
        "executor_base.py": {"errors", "language", "ops"},
        "host_form/lifeline.py": {"collective"}}   # (collective.segments: a rank's lifeline outlives everything else)
# standard modules a package must not need: orchestration keeps host programs and task running; forking ranks and
# watching their lifeline is the host form's, trusting files on disk the disk cache's
FORBIDDEN_STDLIB = {"orchestration": {"multiprocessing", "fcntl", "stat"}}
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


def _stdlib_imports(path):
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("package,module", sorted(m for m in _modules() if m[0] in FORBIDDEN_STDLIB))
def test_packages_keep_to_their_job(package, module):
    assert set(_stdlib_imports(os.path.join(PKG, module))) & FORBIDDEN_STDLIB[package] == set()


@pytest.mark.parametrize("module", sorted(ONLY))
def test_leaf_modules_import_only_what_they_name(module):
    assert set(_imports(os.path.join(PKG, module))) - ONLY[module] == set()


def test_the_op_library_loads_without_the_replay_layer():
    """ops talks to a recording only through ops.recording: importing it (and using it) loads no replay module."""
    code = ("import sys, pypto_rt.ops, pypto_rt.ops.recording; "
            "print(sorted(m for m in sys.modules if m.startswith(('pypto_rt.replay', 'pypto_rt.orchestration'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# the same name in two layers for one idea seen from each side (the reason says why it is one idea), or on its way out
SHARED_NAMES = {
    "distributed.py": "the pld surface (language) and the semantics of its ops (ops), as pl stubs and pl ops",
    "torch_backend.py": "each layer's torch backend: kernels as torch code, communicators on torch.distributed",
    "config.py": "the runtime's knobs, pypto-launch's validated flags and a model's validated shape (kernels/moe, "
                 "serving/model)",
    "files.py": "kernel-library files as modules (golden) and the launcher's log folder (launch)",
    "golden.py": "each kernel library's torch goldens (kernels/moe, kernels/attention, kernels/layers) and the "
                 "decoder's (serving/model), as the kernel library names them",
    "Refused": "a run replay refuses and a peer the launch gateway refuses",
    "RunResult": "the golden harness's result (the kernel library's own name for it) and Runtime.run's result",
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
