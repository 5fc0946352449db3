#!/usr/bin/env bash
# An aarch64 Python 3.11 for qemu-user, cached under build/aarch64-env (rebuilt only when
# missing): Debian bookworm's arm64 python3.11 packages unpacked into root/ (apt-get
# download with its own state directory: the host's dpkg keeps its architectures), the
# aarch64 wheels the engine runs on in deps/ (PyPI's torch 2.10.0 for aarch64, the newest
# CPU-only build there: from 2.11 on PyPI's aarch64 torch is the CUDA build, which needs
# NVIDIA libraries to import), and the project's pure-Python distributions and
# plugin_cpu_arm (its kernel library cross-built with native/toolchains/aarch64.cmake)
# installed into site/.
#
#   scripts/aarch64_env.sh            build (or reuse) the environment
#   scripts/aarch64_env.sh run ARGS   run the aarch64 python with ARGS under qemu-aarch64
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR=${AARCH64_ENV:-$PWD/build/aarch64-env}
ROOT=$ENV_DIR/root
SITE=$ENV_DIR/site
DEPS=$ENV_DIR/deps
QEMU_CPU=${QEMU_CPU:-max}

run() {
    PYTHONHOME=$ROOT/usr PYTHONPATH=$SITE:$DEPS PYTHONNOUSERSITE=1 QEMU_LD_PREFIX=$ROOT QEMU_CPU=$QEMU_CPU \
        qemu-aarch64 "$ROOT/usr/bin/python3.11" "$@"
}
if [ "${1:-}" = run ]; then
    shift
    run "$@"
    exit
fi

if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    scripts/debian_python.sh arm64 "$ROOT"
fi
run -c 'import platform, sys; print("aarch64 python", sys.version.split()[0], platform.machine())'

# core's dependencies for the offline API (not the server's), as aarch64 wheels. pip judges
# environment markers by the host, not --platform: torch goes in without its dependencies
# (its x86_64-only CUDA ones would be looked up), which are listed after it.
TORCH=torch==2.10.0
WHEELS="filelock typing-extensions sympy networkx jinja2 fsspec numpy transformers tokenizers safetensors gguf
sentencepiece tqdm pydantic"
key=$(echo "$TORCH $WHEELS" | sha1sum | cut -c1-16)
if [ "$(cat "$DEPS/.installed" 2>/dev/null)" != "$key" ]; then
    rm -rf "$DEPS"
    pip_aarch64=(python3 -m pip install -q --root-user-action=ignore --target "$DEPS" --only-binary=:all:
                 --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64
                 --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none)
    "${pip_aarch64[@]}" --no-deps "$TORCH"
    "${pip_aarch64[@]}" $WHEELS
    echo "$key" >"$DEPS/.installed"
fi

# the site is rebuilt when a source it is made from changes
key=$(find plugins/src core/src plugin_cpu_arm/src plugin_cpu_arm/pyproject.toml plugin_cpu_arm/CMakeLists.txt \
    native/src native/*.cmake -type f \
    -not -name '*.pyc' -not -path '*egg-info*' | sort | xargs sha1sum | sha1sum | cut -c1-16)
if [ "$(cat "$SITE/.installed" 2>/dev/null)" != "$key" ]; then
    rm -rf "$SITE"
    # pure-Python distributions (the wheels pip builds here are py3-none-any) and pluggy
    python3 -m pip install -q --root-user-action=ignore --no-deps --target "$SITE" ./plugins ./core pluggy
    # plugin_cpu_arm with its library cross-built for aarch64 (scikit-build-core passes CMAKE_ARGS to CMake)
    CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$PWD/native/toolchains/aarch64.cmake" \
        python3 -m pip install -q --root-user-action=ignore --no-deps --target "$SITE" ./plugin_cpu_arm
    echo "$key" >"$SITE/.installed"
fi
