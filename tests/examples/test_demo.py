"""`make demo` (examples/demo.py): the example kernels, then the serving flagship on 4 ranks with the arguments
after `--`; `--kernels-only` skips the flagship; either failing makes the exit code 1."""
import pytest

from examples import demo


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(demo, "run_kernels", lambda: seen.append("kernels") or 0)
    monkeypatch.setattr(demo, "run_flagship", lambda nproc, args: seen.append(("serve", nproc, args)) or True)
    return seen


def test_the_flagship_runs_after_the_kernels_with_the_arguments_after_the_separator(calls):
    assert demo.main([]) == 0
    assert demo.main(["--serve-nproc", "2", "--", "--size", "tiny"]) == 0
    assert calls == ["kernels", ("serve", 4, []), "kernels", ("serve", 2, ["--size", "tiny"])]


def test_kernels_only_skips_the_flagship(calls):
    assert demo.main(["--kernels-only"]) == 0
    assert calls == ["kernels"]


def test_a_failing_flagship_fails_the_demo(calls, monkeypatch):
    monkeypatch.setattr(demo, "run_flagship", lambda nproc, args: False)
    assert demo.main([]) == 1
