"""Every package folder of the repo is in pyproject's package list: a plain (non-editable) install would otherwise
ship without it and fail at import (pypto_rt.replay and pypto_rt.host_form were missing)."""
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _declared() -> tuple[set[str], dict[str, str]]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(setuptools["packages"]), setuptools["package-dir"]


def _package_folders(package_dir: dict[str, str]) -> set[str]:
    roots = {"pypto": "pypto", "pypto_rt": "pypto_rt", **{name: folder for name, folder in package_dir.items()}}
    found = set()
    for name, folder in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    return found


def test_every_package_folder_is_declared():
    declared, package_dir = _declared()
    missing = _package_folders(package_dir) - declared
    assert not missing, f"add these packages to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
