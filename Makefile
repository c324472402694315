# The two commands a new user types: `make demo` and `make test`.
# Both build the virtual environment themselves; only Python >= 3.11 and make are needed.
#
# The repository's folders (jobs/, relay/, worker/, app/, migrations/) are the
# package `postbox` and its subpackages (pyproject's package-dir): the product, all
# that `pip install postbox` gives. examples/ (package `postbox_examples`, command
# `stagedoor`) and bench/ (package `postbox_bench`, command `postbox-bench`) live
# beside it with pyproject files of their own, installed here by the targets that use them. The editable
# install is setuptools' strict mode: a tree of links named as installed, which
# mypy and the tests see exactly as a user's environment sees the wheel. It is
# relinked when a module is added or removed.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEPS   := $(shell cat pyproject.toml examples/pyproject.toml bench/pyproject.toml | cksum | cut -d' ' -f1)
FILES  := $(shell find jobs relay worker app migrations examples bench -name '*.py' -o -name 'py.typed' -o -name '*.mako' 2>/dev/null | sort | cksum | cut -d' ' -f1)
EDITABLE := --config-settings editable_mode=strict

.PHONY: demo test test-unit lint soak bench clean

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "postbox needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# What the demo needs only: postbox with its API, and the examples (Stagedoor, the embedded servers).
$(VENV)/.demo-$(DEPS): | $(VENV)/bin/python
	@echo "installing postbox[api] and the examples into $(VENV) (first run only)..."
	$(PY) -m pip install --quiet -e '.[api]' -e ./examples $(EDITABLE)
	@touch $@

# Everything for development and the test suite (a superset of the demo's): the bench too,
# without the peers (its smoke tests measure postbox alone).
$(VENV)/.dev-$(DEPS): | $(VENV)/bin/python
	@echo "installing postbox[dev], the examples and the bench into $(VENV) (first run only)..."
	$(PY) -m pip install --quiet -e '.[dev]' -e ./examples -e ./bench $(EDITABLE)
	@touch $(VENV)/.demo-$(DEPS) $@

# A module added or removed: relink the editable trees (no dependency changes).
$(VENV)/.files-$(FILES): | $(VENV)/bin/python
	@rm -f $(VENV)/.files-*
	$(PY) -m pip install --quiet --no-deps -e . -e ./examples $(EDITABLE)
	@if $(PY) -c 'import postbox_bench' 2>/dev/null; then $(PY) -m pip install --quiet --no-deps -e ./bench $(EDITABLE); fi
	@touch $@

demo: $(VENV)/.demo-$(DEPS) $(VENV)/.files-$(FILES)
	$(VENV)/bin/stagedoor demo $(DEMO_ARGS)

# The suite on TEST_PROCESSES pytest-xdist processes (most tests wait on the servers;
# tests marked `alone` run with nothing beside them: tests/harness/alone.py).
TEST_PROCESSES ?= 2

test: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist worksteal $(PYTEST_ARGS)

test-unit: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(VENV)/bin/ruff check jobs relay worker app tests migrations examples bench
	$(VENV)/bin/ruff format --check jobs relay worker app tests migrations examples bench
	$(VENV)/bin/mypy

soak: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(PY) -m pytest -m soak $(PYTEST_ARGS)

# The peers too. arq pins redis-py below 6, which postbox (redis-py 8) cannot run on: it is
# installed without its pins, and a peer that fails fails only its own run (docs/benchmarks.md).
# With neither POSTBOX_DATABASE_URL nor POSTBOX_REDIS_URL set, postbox-bench starts embedded
# PostgreSQL and Valkey for the run (as `make demo` does) and stops them at the end.
bench: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(PY) -m pip install --quiet -e './bench[peers]' $(EDITABLE)
	$(PY) -m pip install --quiet --no-deps 'arq>=0.28'
	$(VENV)/bin/postbox-bench all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache *.egg-info examples/build examples/*.egg-info bench/build bench/*.egg-info
