# Two entry points, both safe on a fresh clone: `make demo` and `make test`.
# Each creates (or reuses) a local virtualenv in .venv and installs the project into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit setup browser clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m benchmarks.replay_demo --out-dir out

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The replay report's HTML is checked in a real headless browser: Debian's chromium.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium for the HTML report test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

unit: $(STAMP) browser
	$(BIN)/pytest

test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
