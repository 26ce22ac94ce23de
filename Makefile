# Two entry points a newcomer needs (see README): `make quickstart` and `make test`.
# Both create .venv (Python 3.11), install torch first (the CPU wheel when there is no GPU, so
# pip never pulls a CUDA build), then this package with its test extra, every version taken from
# the lock constraints/cpu.txt. `make lock` refreshes the lock from a fresh venv.

VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
TORCH_CPU ?= torch==2.13.0
LOCK := constraints/cpu.txt
PYTEST_ARGS ?=

.PHONY: setup test quickstart toy lint format clean lock

setup: $(VENV)/.installed

$(VENV)/.installed: setup.py $(LOCK)
	$(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		$(VENV)/bin/pip install -q -c $(LOCK) torch; \
	else \
		$(VENV)/bin/pip install -q -c $(LOCK) $(TORCH_CPU); \
	fi
	$(VENV)/bin/pip install -q -c $(LOCK) -e ".[test]"
	touch $@

# Refresh the lock: a fresh venv with the newest versions setup.py allows, frozen (CPU torch kept).
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q $(TORCH_CPU)
	.venv-lock/bin/pip install -q -e ".[test]"
	{ sed -n '1,3p' $(LOCK); .venv-lock/bin/pip freeze --exclude-editable | grep -v '^#' | sed -E 's/\+cpu$$//'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

quickstart: setup
	bash examples/quickstart_cpu.sh

# The toy recipe (recipes/toy): parallel text from Debian packages, then 3 seeds of the whole chain -> reports/toy/
toy: setup
	$(PY) tools/run_toy.py --seeds 0 1 2

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) runs outputs .pytest_cache
