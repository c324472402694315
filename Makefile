# The two commands a new user types: `make demo` and `make test`.
# Both build the virtual environment themselves; only Python >= 3.11 and make are needed.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test test-unit lint soak bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "postbox needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/postbox demo $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check jobs relay worker app tests migrations
	$(VENV)/bin/mypy

soak: $(STAMP)
	$(PY) -m pytest -m soak $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/postbox bench all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
