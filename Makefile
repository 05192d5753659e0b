# `make demo` and `make test` set everything up on a fresh machine, then run.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup graphviz chromium lint test test-xla-default test-torch soak demo bench bench-jort docs clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# Debian's graphviz provides `dot` for rendering; installed when missing and we are root.
graphviz:
	@command -v dot >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's graphviz (dot)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz) >/dev/null; \
	  else \
	    echo "warning: graphviz's dot is missing; rendering needs it (sudo apt-get install graphviz)"; \
	  fi; }

# Debian's chromium and chromium-driver run the explorer's browser tests (headless,
# offline); installed when missing and we are root.
chromium:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium and chromium-driver"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null; \
	  else \
	    echo "warning: chromium or chromedriver is missing; the browser tests need them (sudo apt-get install chromium chromium-driver)"; \
	  fi; }

setup: $(STAMP) graphviz

# ruff and mypy over mlaxgraph/ (settings in pyproject.toml), then the test suite.
lint: $(STAMP)
	$(PY) -m ruff check
	$(PY) -m mypy

# The suite on pytest-xdist's workers, one per core (at most 4); each worker runs whole
# files, so a file's module fixtures (the docs site, the browser, the sharding workers)
# are built once. `make test TEST_WORKERS=0` runs it in one process. Two parts: the
# tests compiled with XLA CPU's elemental emitter (about 0.6x the compile time), then
# those marked xla_default, whose subject is XLA's default emitter (conftest.py).
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile

test: setup chromium lint
	MLAXGRAPH_TEST_EMITTER=elemental $(PYTEST) -m "not xla_default"
	$(PYTEST) -m xla_default

# Every test under XLA's default CPU emitter, as users compile (about 16 minutes on 2 cores).
test-xla-default: setup chromium lint
	$(PYTEST)

# mg.from_torch against PyTorch itself: torch (about 5 GB with its CUDA libraries),
# torchvision and transformers go into their own environment, never into $(VENV);
# `make test` checks the importer on the committed programs in tests/fixtures/torch
# (tests/fixtures/torch/make.py writes them with this environment).
TORCH_VENV ?= .venv-torch
TORCH_PY := $(TORCH_VENV)/bin/python

$(TORCH_VENV)/.installed: setup.cfg pyproject.toml
	test -x $(TORCH_PY) || python3 -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install --quiet --upgrade pip
	$(TORCH_PY) -m pip install --quiet -e ".[torch-test]"
	touch $@

test-torch: $(TORCH_VENV)/.installed
	$(TORCH_PY) -m pytest -q -p no:cacheprovider tests_torch

# The soak (not part of `make test`; about 25 minutes on 2 cores): 10,000 random graphs
# against the reference interpreter, 100,000 mutated files through the loaders, 120
# saves killed at random points; the figures go to SOAK.md. Then ONNX's whole node
# conformance suite (about 6 minutes): its per-operator table goes to docs/onnx.md and
# its failing cases to tests/data/onnx_failures.txt.
soak: setup
	nice -n 10 $(PY) tests/soak.py --graphs 10000 --files 100000 --kills 120 --workers 2
	nice -n 10 $(PY) tests/_onnx_suite.py --write

demo: setup
	$(PY) -m mlaxgraph demo

# The benchmarks' peer libraries (the `bench` extra: Flax, Haiku, Equinox), once per
# change of setup.cfg.
$(VENV)/.bench-installed: $(STAMP) setup.cfg
	$(PY) -m pip install --quiet -e ".[bench]"
	touch $@

bench: setup $(VENV)/.bench-installed
	$(PY) benchmarks/run.py

# jaxonnxruntime, the other JAX runtime of ONNX files, pins its own dependencies: it gets
# its own environment, and benchmarks/bench_onnx_jort.py runs it beside mlaxgraph.
JORT_VENV ?= .venv-jort

$(JORT_VENV)/.installed:
	test -x $(JORT_VENV)/bin/python || python3 -m venv $(JORT_VENV)
	$(JORT_VENV)/bin/python -m pip install --quiet jaxonnxruntime onnx absl-py
	touch $@

bench-jort: setup $(VENV)/.bench-installed $(JORT_VENV)/.installed
	$(PY) benchmarks/bench_onnx_jort.py --jort $(JORT_VENV)/bin/python

# The documentation site, into site/; any warning (a broken link, a docstring naming a
# parameter that does not exist, a page left out of the nav) fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .hypothesis mlaxgraph-demo
