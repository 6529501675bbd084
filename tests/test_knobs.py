"""Every PYPTO_* knob is declared once (pypto_rt/knobs.py), read through that declaration, and documented."""
from __future__ import annotations

import os
import re
import threading

import pytest

from pypto_rt import knobs
from pypto_rt.errors import PyptoError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def _knob_rows() -> dict[str, str]:
    rows = {}
    for line in _section("CLI reference").splitlines():
        match = re.match(r"\| `(PYPTO_[A-Z_]+)[^`]*` \|(.*)\|$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_every_user_knob_has_a_row_with_its_default():
    rows = _knob_rows()
    for knob in knobs.ALL:
        if knob.audience != knobs.USER:
            continue
        assert knob.env in rows, f"{knob.env} is missing from README's knob table"
        shown = knob.default or knob.unset
        assert "default" in rows[knob.env] and shown in rows[knob.env], \
            f"README's row of {knob.env} does not give its default {shown!r}"


def test_every_launcher_variable_is_in_the_cli_reference():
    cli = _section("CLI reference").split("Environment knobs")[0]
    missing = [k.env for k in knobs.ALL if k.audience == knobs.LAUNCHER and f"`{k.env}" not in cli]
    assert missing == []


def test_the_readme_names_only_declared_variables():
    named = set(re.findall(r"\bPYPTO_[A-Z_]*[A-Z]\b", README))
    assert sorted(named - set(knobs.BY_ENV)) == []


def _py_files(*folders):
    for folder in folders:
        for root, _, files in os.walk(os.path.join(ROOT, folder)):
            yield from (os.path.join(root, f) for f in files if f.endswith(".py"))


def test_no_module_reads_the_environment_itself():
    """Readers go through the declarations (one parse of booleans, one error for a bad value)."""
    readers = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=[^=])")
    found = [os.path.relpath(path, ROOT) for path in _py_files("pypto_rt", "launch", "pypto", "kernels")
             if not path.endswith(os.path.join("pypto_rt", "knobs.py")) and readers.search(open(path).read())]
    assert found == []


def test_knob_names_are_declared_once():
    declared = {}
    pattern = re.compile(r"""Knob\(\s*["']([A-Z_]+)["']""")
    for path in _py_files("pypto_rt", "launch"):
        for name in pattern.findall(open(path).read()):
            declared.setdefault(name, []).append(os.path.relpath(path, ROOT))
    assert {n: p for n, p in declared.items() if p != ["pypto_rt/knobs.py"]} == {}


@pytest.mark.parametrize("raw,expected", [("1", True), ("0", False), ("yes", True), ("Off", False),
                                          (" TRUE ", True), ("", False)])
def test_booleans_parse_one_way(monkeypatch, raw, expected):
    monkeypatch.setenv("PYPTO_STATS", raw)
    assert knobs.STATS.on() is expected and knobs.STATS.get() == ("1" if expected else "0")


def test_a_malformed_boolean_names_its_variable(monkeypatch):
    monkeypatch.setenv("PYPTO_TEE", "maybe")
    with pytest.raises(PyptoError, match=r"PYPTO_TEE='maybe' is not a boolean: use 1 or 0"):
        knobs.TEE.on()


def test_the_harness_reads_the_cpu_fallback_as_a_boolean(monkeypatch):
    monkeypatch.setenv("PYPTO_RUN_CPU_FALLBACK", "maybe")
    from pypto_rt.golden import runner
    with pytest.raises(PyptoError, match="PYPTO_RUN_CPU_FALLBACK"):
        runner._platform_error("a2a3")


def test_overrides_are_scoped_to_the_context(monkeypatch):
    monkeypatch.delenv("PYPTO_EXECUTOR", raising=False)
    seen = []
    with knobs.scope(EXECUTOR="reference"):
        thread = threading.Thread(target=lambda: seen.append(knobs.EXECUTOR.get()))
        thread.start()
        thread.join(10)
        assert knobs.EXECUTOR.get() == "reference"
    assert knobs.EXECUTOR.get() == "compiled" and seen == ["compiled"]


def test_an_unknown_override_is_an_error():
    with pytest.raises(PyptoError, match="unknown knob 'PYPTO_EXECUTER'"):
        with knobs.override({"PYPTO_EXECUTER": "reference"}):
            pass


def test_a_snapshot_sees_every_change_of_the_environment_and_of_overrides(monkeypatch):
    monkeypatch.delenv("PYPTO_STATS", raising=False)
    monkeypatch.delenv("PYPTO_EXECUTOR", raising=False)
    snap = knobs.Snapshot(knobs.STATS, knobs.EXECUTOR)
    first = snap.values()
    assert first == ("0", "compiled") and snap.values() is first   # unchanged: the same tuple, nothing parsed
    monkeypatch.setenv("PYPTO_STATS", "yes")
    assert snap.values() == ("1", "compiled")
    with knobs.scope(EXECUTOR="reference"):
        assert snap.values() == ("1", "reference")
        with knobs.scope(STATS="0"):
            assert snap.values() == ("0", "reference")
        assert snap.values() == ("1", "reference")
    monkeypatch.delenv("PYPTO_STATS")
    assert snap.values() == ("0", "compiled")
    monkeypatch.setenv("PYPTO_STATS", "maybe")
    with pytest.raises(PyptoError, match="PYPTO_STATS='maybe' is not a boolean"):
        snap.values()
