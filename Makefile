# The README's two commands: `make demo` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Exact CPU wheel by default (a looser spec pulls gigabytes of CUDA wheels); override on GPU machines,
# e.g. `make test TORCH_SPEC="torch==2.13.0 --index-url <your CUDA index>"`.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test bench venv clean

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[test,ray]'
	@touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m examples.demo

test: venv
	$(PY) -m pytest -q

# `make bench BENCH_ARGS="--only moe_dispatch --full"`: options of python -m bench
bench: venv
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
