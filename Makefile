# `make demo` and `make test` set everything up themselves on a machine with only Python 3.10+.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is installed first and pinned: it is the local CPU build, where a bare `torch`
# requirement would pull several GB of CUDA packages.
TORCH_SPEC ?= torch==2.13.0
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo test test-fast lint benchmark clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP) lint
	$(PY) -m pytest -q tests

# The quick loop while editing: everything but the tests marked slow (subprocesses, recipes end to end, training).
test-fast: $(STAMP) lint
	$(PY) -m pytest -q -m "not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

benchmark: $(STAMP)
	$(PY) scripts/benchmark.py

clean:
	rm -rf $(VENV) build *.egg-info
