# Two commands for a fresh machine:  `make run`  and  `make test`  (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Re-install only when pyproject.toml changes.
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# PostgreSQL for the second pass of `make test` (the data layer on both databases).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres

.PHONY: install run test test-sqlite test-postgres lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || (echo "collab needs Python 3.11+" && exit 1)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

run: install
	$(BIN)/python manage.py serve

# SQLite with the in-memory and Redis layers, then the database tests on PostgreSQL.
test: install
	$(MAKE) --no-print-directory test-sqlite
	$(MAKE) --no-print-directory test-postgres

test-sqlite: install
	$(BIN)/pytest

test-postgres: install
	@if $(BIN)/python -m collab.dbcheck "$(TEST_DATABASE_URL)"; then \
		DATABASE_URL="$(TEST_DATABASE_URL)" $(BIN)/pytest -m "not e2e and not loadtest" ; \
	elif [ -n "$$CI" ]; then echo "PostgreSQL is required in CI: $(TEST_DATABASE_URL) does not answer" && exit 1; \
	else echo "skipping the PostgreSQL pass: $(TEST_DATABASE_URL) does not answer"; fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy collab

clean:
	rm -rf $(VENV) .staticfiles .pytest_cache .mypy_cache .ruff_cache db.sqlite3* .test-db.sqlite3*
