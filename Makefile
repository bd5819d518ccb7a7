# Two commands for a fresh machine:  `make run`  and  `make test`  (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Re-install only when pyproject.toml changes.
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# The `local` extra (llama.cpp, built from source once), on top of the above.
LOCAL_STAMP := $(VENV)/.local-$(shell cksum pyproject.toml | cut -d' ' -f1)
# The model `make run` starts when no endpoint is configured: local (SmolLM2 through
# llama.cpp) or simulated (`make run MODEL=simulated`: no build, canned text).
MODEL ?= local
# PostgreSQL for the second pass of `make test` (the data layer on both databases).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
# Test processes (pytest-xdist): most tests wait on sockets and servers, so more
# processes than cores (README "Tests" has the times measured).
TEST_WORKERS ?= 4
PYTEST := $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

.PHONY: install install-local run test test-sqlite test-postgres lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || (echo "collab needs Python 3.11+" && exit 1)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

# pip -v through collab/buildprogress.py: pip's own steps and summary, and llama.cpp's
# build as its step counter ("[37/193] ggml-cpu.c.o  (2:31)", one line updated in place);
# pip's whole output goes to $(LOCAL_LOG), and its last lines are shown if it fails.
LOCAL_LOG := .cache/local-install.log
$(LOCAL_STAMP): $(STAMP)
	@$(BIN)/python -m pip show -q llama-cpp-python >/dev/null 2>&1 || \
		echo "Building llama-cpp-python for the local model (once; about 6 minutes on 2 idle cores) ..."
	@$(BIN)/python -m collab.buildprogress --log $(LOCAL_LOG) -- \
		$(BIN)/python -m pip install -v -e '.[dev,local]' || { \
		echo "llama-cpp-python could not be installed (it builds with a C/C++ compiler and CMake)."; \
		echo "make run MODEL=simulated runs collab on the simulated model instead."; exit 1; }
	@rm -f $(VENV)/.local-* && touch $@

install-local: $(LOCAL_STAMP)

# llama.cpp is installed only when `make run` is going to start it.
ifeq ($(MODEL)$(COLLAB_LLM_BASE_URL)$(OPENAI_API_KEY),local)
run: install-local
else
run: install
endif
	$(BIN)/python manage.py serve --model $(MODEL)

# SQLite with the in-memory and Redis layers, then the database tests on PostgreSQL.
# The local-model test (in the SQLite pass) needs llama.cpp: installed here too.
test: install-local
	$(MAKE) --no-print-directory test-sqlite
	$(MAKE) --no-print-directory test-postgres

test-sqlite: install-local
	$(PYTEST)

# The tests that use the database (the `database` mark, tests/conftest.py) and Daphne end
# to end (on a throwaway database of that server), on the in-memory layer. Not repeated
# here: the Redis layers' runs of the same tests and the e2e tests on Redis (several
# Daphne processes already run on PostgreSQL in the first pass, tests/cluster.py), the
# tests that use no database, the browser, the load test and the local model.
test-postgres: install
	@if $(BIN)/python -m collab.dbcheck "$(TEST_DATABASE_URL)"; then \
		DATABASE_URL="$(TEST_DATABASE_URL)" $(PYTEST) \
			-m "(database or e2e) and not redis and not loadtest and not localmodel and not browser" ; \
	elif [ -n "$$CI" ]; then echo "PostgreSQL is required in CI: $(TEST_DATABASE_URL) does not answer" && exit 1; \
	else echo "skipping the PostgreSQL pass: $(TEST_DATABASE_URL) does not answer"; fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy collab
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .staticfiles .pytest_cache .mypy_cache .ruff_cache .import_linter_cache db.sqlite3* .test-db.sqlite3*
