# Everything runs from the project's own virtualenv, created on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Empty: the default data directory ($$XDG_DATA_HOME/lookup-knowledge-mcp), which mcp.json also uses.
DATA_DIR ?=
DATA_FLAG := $(if $(DATA_DIR),--data-dir "$(DATA_DIR)")
HOST ?= 127.0.0.1
PORT ?= 8765
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test test-fast lint bench install install-dev ingest-sample clean milvus-start milvus-stop

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first, pinned to the CPU build, so no dependency pulls a multi-GB CUDA build.
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[bge-m3,dev]"
	touch $@

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev
	touch $(VENV)/.installed

ingest-sample: install
	$(BIN)/lookup-knowledge-mcp ingest examples/knowledge $(DATA_FLAG)

run: ingest-sample
	@$(BIN)/python scripts/print-connect-help.py --data-dir "$(DATA_DIR)" --host $(HOST) --port $(PORT)
	$(BIN)/lookup-knowledge-mcp serve --transport streamable-http --host $(HOST) --port $(PORT) $(DATA_FLAG)

# The suites that run a second time against a real Milvus 2.3.5 server (started and stopped by
# the session fixture). Skipped, with the reason printed, only where the milvus package is absent
# (no wheel for this platform); a failure there fails `make test`.
MILVUS_SERVER_SUITES := tests/test_ingest.py tests/test_mcp_server.py tests/test_sharing.py tests/test_live_updates.py \
	tests/test_vectorless_catalog.py tests/test_duplicate_vectors.py tests/test_replicas.py

test: install-dev
	bash scripts/install-chromium
	$(BIN)/python -m pytest -q -rs
	@if problem="$$($(BIN)/python -c 'from tests.milvus_server import package_problem; print(package_problem() or "")')" && [ -z "$$problem" ]; then \
		echo "== the same suites against a Milvus 2.3.5 server"; \
		$(BIN)/python -m pytest -q --milvus-server $(MILVUS_SERVER_SUITES); \
	else \
		echo "SKIPPED the Milvus-server suites: $${problem:-cannot check the milvus package}"; \
	fi
	bash scripts/inspector-smoke
	bash scripts/conformance

# The edit-test loop: every suite but the end-to-end ones marked slow (subprocesses, servers,
# a browser, many calls). Under 4 minutes on 2 cores (README, Development); `make test` runs everything.
test-fast: install-dev
	$(BIN)/python -m pytest -q -m "not slow"

lint: install-dev
	$(BIN)/ruff check server storage retrieval tests bench scripts
	$(BIN)/ruff format --check server storage retrieval tests bench scripts
	$(BIN)/mypy

bench: install-dev
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.server_bench
	# Capacity over HTTP and a 30-minute soak; LOOKUP_BENCH_SOAK_S=0 skips the soak.
	$(BIN)/python -m bench.capacity

# A Milvus 2.3.5 standalone server for trying milvus.uri by hand: prints the URI to use.
MILVUS_DATA ?= .cache/milvus-server
milvus-start: install-dev
	$(BIN)/python -m tests.milvus_server start --data $(MILVUS_DATA)

milvus-stop:
	$(BIN)/python -m tests.milvus_server stop --data $(MILVUS_DATA)

clean:
	rm -rf $(VENV) .cache .pytest_cache
