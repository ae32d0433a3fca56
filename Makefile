# flowsvc: `make serve` runs the embedded default; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
export FLOWSVC_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/test
export FLOWSVC_TEST_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: serve test lint typecheck pytest bench clean wrk chromium bubblewrap node_modules contracts

# A command the tests need from Debian: installed when missing and we may (root with apt-get),
# otherwise named in one line (no raw apt error for a user without root).
define debian_package
@command -v $(1) >/dev/null || { \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
    echo "installing $(2) (Debian package) for $(1)"; \
    apt-get update -qq >/dev/null && apt-get install -y -qq $(2) >/dev/null; \
  else \
    echo "$(1) not found: install the Debian package $(2) (sudo apt-get install $(2)), then run make again" >&2; \
    exit 1; \
  fi; }
endef

$(STAMP): pyproject.toml examples/flowsvc-hello/pyproject.toml client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]" -e examples/flowsvc-hello -e client
	touch $(STAMP)

# anvil and solc, for the chain tests: npm install follows the lock file (npm ci can refuse a
# lock that lists platform packages the registry does not serve here).
$(NODE_STAMP): package.json package-lock.json
	$(call debian_package,npm,nodejs npm)
	npm install --no-audit --no-fund
	touch $(NODE_STAMP)

node_modules: $(NODE_STAMP)

# Recompiles contracts/*.sol into the committed contracts/artifacts/.
contracts: $(NODE_STAMP)
	node contracts/build.js

serve: $(STAMP)
	$(BIN)/flowsvc serve

lint: $(STAMP)
	$(BIN)/ruff check runtime plugins tests bench examples client

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) $(NODE_STAMP) wrk chromium bubblewrap
	$(BIN)/pytest -q

# wrk is the load generator of bench/ and of its harness tests (Debian package).
wrk:
	$(call debian_package,wrk,wrk)

# Headless Chromium loads /docs in tests/runtime/test_docs_page.py (Debian package).
chromium:
	$(call debian_package,chromium,chromium)

# bwrap is the sandbox of run_command and take_screenshot, socat its dev-server bridge
# (docs/agent-runtime.md).
bubblewrap:
	$(call debian_package,bwrap,bubblewrap)
	$(call debian_package,socat,socat)

test: lint typecheck pytest

bench: $(STAMP) $(NODE_STAMP) wrk
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) node_modules var .mypy_cache .ruff_cache .pytest_cache
