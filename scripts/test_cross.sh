#!/usr/bin/env bash
# make test-cross: the CPU kernel library (native/) cross-built for aarch64 and s390x and
# its kernel tests (native/tests/test_kernels.cpp) run under qemu-user, on each emulated
# CPU model of the target's toolchain file (native/toolchains/): every ISA path the model
# runs is checked against the scalar reference. On an s390x Python under qemu
# (scripts/s390x_env.sh): the default model's GGUF tensors converted to big-endian by the
# SDK and multiplied by plugin_s390x's kernels, against x86's values. Installs the cross compilers and
# qemu-user with apt when missing. Prints one summary line per target and CPU model;
# exits non-zero when a test fails. Then, on an aarch64 Python under qemu
# (scripts/aarch64_env.sh): `core devices`, and the offline API's greedy tokens on cpu_arm
# against cpu_x86's in the x86 venv ($VENV, default .venv: `make test-cross` installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v make >/dev/null || need+=(make)
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v s390x-linux-gnu-g++ >/dev/null || need+=(g++-s390x-linux-gnu)
{ command -v qemu-aarch64 && command -v qemu-s390x; } >/dev/null || need+=(qemu-user)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "installing ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

jobs=$(nproc 2>/dev/null || echo 2)
status=0
summary=()
for target in aarch64 s390x; do
    build="build/cross-$target"
    cmake -S native -B "$build" -DCMAKE_TOOLCHAIN_FILE="$PWD/native/toolchains/$target.cmake" >/dev/null
    cmake --build "$build" -j "$jobs" >/dev/null
    # ctest -V prefixes each test's output with its number: keep the failures and summaries
    if ! out=$(ctest --test-dir "$build" -V 2>&1); then status=1; fi
    grep -E '^[0-9]+: (FAIL|qemu)' <<<"$out" | grep FAIL || true
    while IFS= read -r line; do summary+=("$target ${line#*: }"); done < <(grep -E '^[0-9]+: qemu -cpu' <<<"$out")
    grep -q 'qemu -cpu' <<<"$out" || { echo "$target: no test ran"; echo "$out" | tail -20; status=1; }
done

py=${VENV:-.venv}/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the GGUF loader's byte-order conversion on a big-endian CPU: every tensor of the default
# model converted by plugins.byteorder on an s390x Python (scripts/s390x_env.sh, cached) must
# dequantize to x86's values, and plugin_s390x's kernels must multiply the converted blocks
# right on each variant the emulated CPU runs (scripts/s390x_byteorder.py)
scripts/s390x_env.sh >/dev/null
summary+=("s390x $(qemu-s390x --version | head -1)")
model=$("$py" -c 'from core.loader.source import default_model_path; print(default_model_path())')
"$py" scripts/s390x_byteorder.py expect "$model" "$tmp/expected.json" >/dev/null
if out=$(scripts/s390x_env.sh run scripts/s390x_byteorder.py check "$model" "$tmp/expected.json" 2>&1); then
    while IFS= read -r line; do summary+=("$line"); done <<<"$out"
else
    echo "$out" | tail -20
    summary+=("s390x big-endian GGUF load: FAIL")
    status=1
fi

# plugin_cpu_arm installed on an aarch64 Python (scripts/aarch64_env.sh, cached under build/):
# `core devices` under qemu must list it available, with the kernel variant each CPU model runs
scripts/aarch64_env.sh >/dev/null
for check in max:neon_bf16 cortex-a72:neon; do
    cpu=${check%%:*} isa=${check#*:}
    line=$(QEMU_CPU=$cpu scripts/aarch64_env.sh run -c 'import sys; from core.cli import main; sys.exit(main(["devices"]))' |
        grep '^cpu_arm' || true)
    if grep -qE "available .*kernel_isa=$isa\b" <<<"$line"; then
        summary+=("aarch64 python -cpu $cpu: core devices lists cpu_arm available, kernel_isa=$isa")
    else
        summary+=("aarch64 python -cpu $cpu: FAIL, core devices says: ${line:-nothing for cpu_arm}")
        status=1
    fi
done
# the offline API end to end: a tiny random Llama (one checkpoint for both sides) greedy on
# cpu_arm under qemu must give cpu_x86's tokens. CPU models: max runs the neon_bf16 kernels,
# a64fx the plain neon ones (cortex-a72, ARMv8.0, cannot run PyPI's torch: SIGILL on import)
"$py" scripts/greedy_tokens.py build "$tmp/model" 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
x86=$("$py" scripts/greedy_tokens.py run "$tmp/model" cpu_x86 2>"$tmp/log" | tail -1) || { cat "$tmp/log"; exit 1; }
echo "x86_64: $x86"
tokens() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])["tokens"])' "$1"; }
for check in max:neon_bf16 a64fx:neon; do
    cpu=${check%%:*} isa=${check#*:}
    arm=$(QEMU_CPU=$cpu scripts/aarch64_env.sh run scripts/greedy_tokens.py run "$tmp/model" cpu_arm 2>"$tmp/log" |
        tail -1) || { tail -20 "$tmp/log"; arm="{}"; }
    echo "aarch64 -cpu $cpu: $arm"
    if grep -q "\"kernel_isa\": \"$isa\"" <<<"$arm" && [ "$(tokens "$arm")" = "$(tokens "$x86")" ]; then
        summary+=("aarch64 python -cpu $cpu: LLM(device='cpu_arm') greedy tokens equal cpu_x86's (kernel_isa=$isa)")
    else
        summary+=("aarch64 python -cpu $cpu: FAIL, cpu_arm's greedy tokens (kernel_isa=$isa) differ from cpu_x86's")
        status=1
    fi
done
printf '%s\n' "${summary[@]}"
exit $status
