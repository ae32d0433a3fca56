# flowsvc: `make serve` runs the embedded default; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
export FLOWSVC_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/test
export FLOWSVC_TEST_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: serve test lint typecheck pytest bench clean wrk node_modules contracts

$(STAMP): pyproject.toml examples/flowsvc-hello/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]" -e examples/flowsvc-hello
	touch $(STAMP)

# anvil and solc, for the chain tests: npm install follows the lock file (npm ci can refuse a
# lock that lists platform packages the registry does not serve here).
$(NODE_STAMP): package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js 20+ with npm (apt-get install nodejs npm)" >&2; exit 1; }
	npm install --no-audit --no-fund
	touch $(NODE_STAMP)

node_modules: $(NODE_STAMP)

# Recompiles contracts/*.sol into the committed contracts/artifacts/.
contracts: $(NODE_STAMP)
	node contracts/build.js

serve: $(STAMP)
	$(BIN)/flowsvc serve

lint: $(STAMP)
	$(BIN)/ruff check runtime plugins tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) $(NODE_STAMP) wrk
	$(BIN)/pytest -q

# wrk is the load generator of bench/ and of its harness tests (Debian package).
wrk:
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)

test: lint typecheck pytest

bench: $(STAMP) wrk
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) node_modules var .mypy_cache .ruff_cache .pytest_cache
