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

# transformers' common model tests ship in its source distribution, not in the wheel: fetched once per installed
# version for tests/test_transformers_common.py.
TRANSFORMERS_TESTS := .cache/transformers-tests

.PHONY: demo test test-library test-research test-fast lint benchmark clean transformers-tests

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

# Two tiers, both must pass: the library's tests, then the research code's (tests marked `research` by
# tests/conftest.py: benchmarks/, experiments/ and their scripts).
test: test-library test-research

# transformers-tests fetched the common model tests: their file must not skip for want of them.
test-library: $(STAMP) lint transformers-tests
	ORCHID_REQUIRE_TRANSFORMERS_TESTS=1 $(PY) -m pytest -q -m "not research" tests

test-research: $(STAMP) lint
	$(PY) -m pytest -q -m research tests

# The quick loop while editing: everything but the tests marked slow (subprocesses, recipes end to end, training).
test-fast: $(STAMP) lint transformers-tests
	ORCHID_REQUIRE_TRANSFORMERS_TESTS=1 $(PY) -m pytest -q -m "not slow" tests

transformers-tests: $(STAMP)
	@version=$$($(PY) -c "import transformers; print(transformers.__version__)"); \
	if [ "$$(cat $(TRANSFORMERS_TESTS)/VERSION 2>/dev/null)" != "$$version" ]; then \
		rm -rf $(TRANSFORMERS_TESTS) && mkdir -p $(TRANSFORMERS_TESTS) && \
		$(PY) -m pip download -q --no-deps --no-binary :all: -d $(TRANSFORMERS_TESTS) "transformers==$$version" && \
		tar -xzf $(TRANSFORMERS_TESTS)/transformers-$$version.tar.gz -C $(TRANSFORMERS_TESTS) \
			--strip-components=1 "transformers-$$version/tests" && \
		rm $(TRANSFORMERS_TESTS)/transformers-$$version.tar.gz && touch $(TRANSFORMERS_TESTS)/tests/__init__.py && \
		echo "$$version" > $(TRANSFORMERS_TESTS)/VERSION; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .

benchmark: $(STAMP)
	$(PY) scripts/benchmark.py

clean:
	rm -rf $(VENV) build *.egg-info
