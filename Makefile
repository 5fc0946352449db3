# The two set-up commands of the README:
#   make serve   install everything and serve the default model on :8000
#   make test    install everything and run every test suite
#   make test-docker  build docker/Dockerfile.cpu and check the served image end to end
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

# what an install is made from: when none of it changed since the last install (the
# stamp files), `make serve` / `make test` start at once instead of reinstalling
SOURCES := scripts/install.sh requirements-test.txt $(wildcard $(shell git ls-files plugins core 'plugin_*' \
	2>/dev/null || find plugins core plugin_* -type f -not -path '*/build/*' -not -name '*.pyc'))

.PHONY: install install-test serve test test-docker lint dev

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

$(VENV)/.installed: $(SOURCES)
	scripts/install.sh
	touch $@

$(VENV)/.installed-test: $(SOURCES)
	WITH_TEST_DEPS=1 scripts/install.sh
	touch $@ $(VENV)/.installed

dev:
	WITH_TEST_DEPS=1 scripts/install.sh --editable

serve: install
	$(VENV)/bin/core serve --device auto --port $(PORT)

test: install-test
	$(PY) -m pytest -q plugins/tests core/tests $(wildcard plugin_*/tests) tests

test-docker:
	docker/test.sh

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
