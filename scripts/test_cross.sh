#!/usr/bin/env bash
# make test-cross: the CPU kernel library (native/) cross-built for aarch64 and s390x and
# its kernel tests (native/tests/test_kernels.cpp) run under qemu-user, on each emulated
# CPU model of the target's toolchain file (native/toolchains/): every ISA path the model
# runs is checked against the scalar reference. Installs the cross compilers and
# qemu-user with apt when missing. Prints one summary line per target and CPU model;
# exits non-zero when a test fails. Then `core devices` on an aarch64 Python under qemu.
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
printf '%s\n' "${summary[@]}"
exit $status
