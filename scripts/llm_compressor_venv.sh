#!/usr/bin/env bash
# Prints the python of a venv with llm-compressor (vLLM's quantizer), made once under
# $CORE_LLMC_CACHE (default ~/.cache/core-llmc; ~1.5 GB, about a minute). It lives apart
# from the project's venv because llm-compressor pins an older transformers. Used by
# tests/test_llm_compressor.py and bench/quantized_checkpoints.py through
# scripts/llm_compressor_quantize.py.
set -euo pipefail

PINS="torch==2.13.0 llmcompressor==0.14.0.1"
CACHE=${CORE_LLMC_CACHE:-$HOME/.cache/core-llmc}
VENV="$CACHE/venv-$(echo "$PINS" | sha256sum | cut -c1-12)"
PY="$VENV/bin/python"

if [ ! -f "$VENV/.ready" ]; then
    echo "llm-compressor: building $VENV ($PINS)" >&2
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    "$PY" -m pip install --disable-pip-version-check -q $PINS >&2
    touch "$VENV/.ready"
fi
echo "$PY"
