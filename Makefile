# make test: everything from scratch (venv, Node tools, promtool) then lint, types, the docs site and the suite.
# make demo: a demo fleet of real MCP servers behind the gateway on 127.0.0.1:8080.
# Everything they install goes into .venv/ and .tools/ (pip's and npm's download caches too), which
# `make clean` removes; only the apt packages (redis-server, prometheus) go to the system.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-test
export PIP_CACHE_DIR    ?= $(CURDIR)/.tools/cache/pip
export npm_config_cache ?= $(CURDIR)/.tools/cache/npm

.PHONY: test lint typecheck docs unit demo tools bench soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,speed]'
	touch $@

tools:
	bash scripts/install-tools.sh
	bash scripts/check-deploy.sh install

lint: $(STAMP)
	$(BIN)/ruff check gateway tests

typecheck: $(STAMP)
	$(BIN)/mypy

# The docs site (mkdocs.yml, docs/), built offline; --strict: a broken link or nav entry fails.
# NO_MKDOCS_2_WARNING: mkdocs-material's banner about its successor, printed on every build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(VENV)/site

unit: $(STAMP)
	$(BIN)/pytest -q

test: $(STAMP) tools lint typecheck docs
	$(BIN)/pytest -q -p no:cacheprovider

DEMO_STAMP := $(VENV)/.installed-demo
PORT ?= 8080

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[demo,speed]'
	touch $@

# MCP_GATEWAY_VIA_MAKE: the demo's hints then say `make demo PORT=...`, not `mcp-gateway demo --port ...`.
demo: $(DEMO_STAMP)
	MCP_GATEWAY_VIA_MAKE=1 $(BIN)/mcp-gateway demo --port $(PORT)

bench: $(STAMP)
	bash scripts/install-bench-tools.sh
	$(BIN)/python bench/run.py $(BENCH_ARGS)

soak: $(STAMP)
	$(BIN)/python scripts/soak.py --duration $(or $(DURATION),60)

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache .hypothesis mcp_gateway.egg-info
