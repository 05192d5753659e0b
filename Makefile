# `make demo` and `make test` set everything up on a fresh machine, then run.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup graphviz test demo bench clean

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

setup: $(STAMP) graphviz

test: setup
	$(PY) -m pytest -q

demo: setup
	$(PY) -m mlaxgraph demo

bench: setup
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis mlaxgraph-demo
