# The two set-up commands of the README:
#   make serve   install everything and serve the default model on :8000
#   make test    install everything and run every test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: install install-test serve test lint dev

install:
	scripts/install.sh

install-test:
	WITH_TEST_DEPS=1 scripts/install.sh

dev:
	WITH_TEST_DEPS=1 scripts/install.sh --editable

serve: install
	$(VENV)/bin/core serve --device auto --port $(PORT)

test: install-test
	$(PY) -m pytest -q plugins/tests core/tests $(wildcard plugin_*/tests) tests

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
