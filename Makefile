# flowsvc: `make serve` runs the embedded default; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export FLOWSVC_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/test
export FLOWSVC_TEST_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: serve test lint typecheck pytest bench clean wrk

$(STAMP): pyproject.toml examples/flowsvc-hello/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]" -e examples/flowsvc-hello
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/flowsvc serve

lint: $(STAMP)
	$(BIN)/ruff check runtime plugins tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) wrk
	$(BIN)/pytest -q

# wrk is the load generator of bench/ and of its harness tests (Debian package).
wrk:
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)

test: lint typecheck pytest

bench: $(STAMP) wrk
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache
