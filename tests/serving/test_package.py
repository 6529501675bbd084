"""The serving host side imports only pypto_rt.errors and its own modules (the model is given to it; the rank
group also the job's communicator, pypto_rt.collective; the runner's compiling warm-up the replay policy, whose
tier mode it scopes), and its public names are exported."""
from __future__ import annotations

import ast
import os

import pypto_rt.serving as serving

HOST_SIDE = os.path.dirname(os.path.abspath(serving.__file__))


def _pypto_imports(path):
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pypto_rt"):
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("pypto_rt"))


ALSO_ALLOWED = {"rank_group.py": {"pypto_rt.collective"},    # the step agreement runs on the job's communicator
                "model_runner.py": {"pypto_rt.replay.policy"}}   # the compiling warm-up: PYPTO_TIER=eager, scoped


def test_the_host_side_imports_only_errors_and_itself():
    bad = {}
    for name in sorted(os.listdir(HOST_SIDE)):
        if name.endswith(".py"):
            mods = [m for m in _pypto_imports(os.path.join(HOST_SIDE, name))
                    if (m != "pypto_rt.errors" and not m.startswith("pypto_rt.serving.")
                        or m == "pypto_rt.serving.model" or m.startswith("pypto_rt.serving.model."))
                    and m not in ALSO_ALLOWED.get(name, ())]
            if mods:
                bad[name] = mods
    assert bad == {}


def test_public_names_are_exported():
    for name in serving.__all__:
        assert hasattr(serving, name), name
    assert serving.Engine is serving.ServingEngine
