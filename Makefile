# The two commands a new user types: `make demo` and `make test`.
# Both build the virtual environment themselves; only Python >= 3.11 and make are needed.
#
# The repository's folders (jobs/, relay/, worker/, app/, migrations/) are the
# package `postbox` and its subpackages (pyproject's package-dir). The editable
# install is setuptools' strict mode: a tree of links named as installed, which
# mypy and the tests see exactly as a user's environment sees the wheel. It is
# relinked when a module is added or removed.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEPS   := $(shell cksum pyproject.toml | cut -d' ' -f1)
FILES  := $(shell find jobs relay worker app migrations -name '*.py' -o -name 'py.typed' -o -name '*.mako' 2>/dev/null | sort | cksum | cut -d' ' -f1)
EDITABLE := --config-settings editable_mode=strict

.PHONY: demo test test-unit lint soak bench clean

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "postbox needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# What the demo needs only: postbox, its API, the example and the embedded servers.
$(VENV)/.demo-$(DEPS): | $(VENV)/bin/python
	@echo "installing postbox[demo] into $(VENV) (first run only)..."
	$(PY) -m pip install --quiet -e '.[demo]' $(EDITABLE)
	@touch $@

# Everything for development and the test suite (a superset of the demo's).
$(VENV)/.dev-$(DEPS): | $(VENV)/bin/python
	@echo "installing postbox[dev] into $(VENV) (first run only)..."
	$(PY) -m pip install --quiet -e '.[dev]' $(EDITABLE)
	@touch $(VENV)/.demo-$(DEPS) $@

# A module added or removed: relink the editable tree (no dependency changes).
$(VENV)/.files-$(FILES): | $(VENV)/bin/python
	@rm -f $(VENV)/.files-*
	$(PY) -m pip install --quiet --no-deps -e . $(EDITABLE)
	@touch $@

demo: $(VENV)/.demo-$(DEPS) $(VENV)/.files-$(FILES)
	$(VENV)/bin/postbox demo $(DEMO_ARGS)

# The suite on TEST_PROCESSES pytest-xdist processes (most tests wait on the servers;
# tests marked `alone` run with nothing beside them: tests/harness/alone.py).
TEST_PROCESSES ?= 2

test: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist worksteal $(PYTEST_ARGS)

test-unit: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(VENV)/bin/ruff check jobs relay worker app tests migrations
	$(VENV)/bin/mypy

soak: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(PY) -m pytest -m soak $(PYTEST_ARGS)

bench: $(VENV)/.dev-$(DEPS) $(VENV)/.files-$(FILES)
	$(PY) -m pip install --quiet -e '.[bench]' $(EDITABLE)
	$(VENV)/bin/postbox bench all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache *.egg-info
