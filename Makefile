# The two set-up commands of the README:
#   make serve   install everything and serve the default model on :8000
#   make test    install everything and run every test suite
#   make test-cross  the CPU kernels of aarch64 and s390x, cross-built and tested under qemu
#   make test-xla plugin_tpu's XLA tests on torch_xla's CPU device, in a cached venv of
#                 torch 2.9.0 + torch_xla 2.9.0 outside the clone (scripts/test-xla.sh)
#   make test-xpu-compile  every shared Triton kernel compiled for Intel GPUs (pvc, dg2) by
#                 triton-xpu, in a cached venv outside the clone (scripts/test-xpu-compile.sh)
#   make test-docker  build docker/Dockerfile.cpu and check the served image end to end
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

# what an install is made from: when none of it changed since the last install (the
# stamp files), `make serve` / `make test` start at once instead of reinstalling
SOURCES := scripts/install.sh requirements-test.txt $(wildcard $(shell git ls-files plugins core native 'plugin_*' \
	2>/dev/null || find plugins core native plugin_* -type f -not -path '*/build/*' -not -name '*.pyc'))

.PHONY: install install-test serve test test-cross test-xla test-xpu-compile test-docker lint dev

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

# every suite, then cpu_x86's again on its AVX2 kernels: the path of AVX2-only CPUs (Zen 1/2, older
# Xeons), whose model-level behaviour (expert packing, refusals, the fused decoder) a wider host's
# own run does not reach (~1 min)
test: install-test
	$(PY) -m pytest -q plugins/tests core/tests $(wildcard plugin_*/tests) tests
	CORE_CPU_KERNEL_ISA=avx2 $(PY) -m pytest -q -p no:cacheprovider plugin_cpu_x86/tests

# the CPU kernels cross-built for aarch64 and s390x and tested under qemu-user, and the
# engine on cpu_arm under qemu against cpu_x86 in the venv
test-cross: install
	VENV=$(VENV) scripts/test_cross.sh

test-xla:
	scripts/test-xla.sh

# every shared Triton kernel compiled to SPIR-V for Intel GPU targets (pvc, dg2) by Intel's
# Triton, in a cached venv outside the clone (scripts/test-xpu-compile.sh)
test-xpu-compile:
	scripts/test-xpu-compile.sh

test-docker:
	docker/test.sh

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
