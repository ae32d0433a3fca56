# flowsvc: `make serve` runs the embedded default; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
export FLOWSVC_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/test
export FLOWSVC_TEST_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: serve test lint typecheck pytest bench clean wrk chromium bubblewrap haproxy node_modules contracts lock

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

# Python dependencies come from requirements.lock (every package pinned with its hashes, wheels
# only), so a fresh machine runs what CI ran; our own three packages install on top without
# resolving anything. `make lock` rewrites the lock from the ranges in the pyproject files.
$(STAMP): requirements.lock pyproject.toml examples/flowsvc-hello/pyproject.toml client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes --only-binary :all: -r requirements.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e . -e examples/flowsvc-hello -e client
	$(BIN)/pip check
	touch $(STAMP)

# anvil and solc, for the chain tests, exactly as package-lock.json lists them (npm ci never
# rewrites the lock; anvil's binary comes in its platform package, so no install script runs).
$(NODE_STAMP): package.json package-lock.json
	$(call debian_package,npm,nodejs npm)
	npm ci --no-audit --no-fund --ignore-scripts
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

pytest: $(STAMP) $(NODE_STAMP) wrk chromium bubblewrap haproxy
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

# HAProxy runs the shipped docs/haproxy/flowsvc.cfg in tests/system/test_haproxy.py.
haproxy:
	$(call debian_package,haproxy,haproxy)

test: lint typecheck pytest

bench: $(STAMP) $(NODE_STAMP) wrk
	$(BIN)/python -m bench.run_all

# Rewrites requirements.lock from the dependency ranges of pyproject.toml and client/, with
# hashes, in a throwaway venv with a pinned pip-tools: pins that still fit are kept and new
# dependencies added; `make lock UPGRADE=1` moves every pin to the newest version that fits.
# Commit the result.
lock:
	$(PYTHON) -m venv var/lock-venv
	var/lock-venv/bin/pip install --quiet pip-tools==7.6.2
	var/lock-venv/bin/pip-compile --quiet $(if $(UPGRADE),--upgrade) --generate-hashes \
	  --allow-unsafe --strip-extras \
	  --all-build-deps --extra dev --no-emit-find-links --no-emit-index-url \
	  --output-file requirements.lock pyproject.toml client/pyproject.toml

clean:
	rm -rf $(VENV) node_modules var .mypy_cache .ruff_cache .pytest_cache
