#!/usr/bin/env bash
# A big-endian Python for qemu-user: Debian bookworm's s390x python3.11 and python3-numpy
# unpacked into root/ (scripts/debian_python.sh), and in site/ the pure-Python `gguf` reader,
# the SDK (plugins) and plugin_s390x with its kernel library cross-built with
# native/toolchains/s390x.cmake. No torch: PyPI has no s390x wheel. Cached under
# ~/.cache/core/s390x-env (root/ kept once made; site/ rebuilt when a source it is made of changes).
#
#   scripts/s390x_env.sh            build (or reuse) the environment
#   scripts/s390x_env.sh run ARGS   run the s390x python with ARGS under qemu-s390x (QEMU_CPU, default max)
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR=${S390X_ENV:-$HOME/.cache/core/s390x-env}
ROOT=$ENV_DIR/root
SITE=$ENV_DIR/site

run() {
    PYTHONHOME=$ROOT/usr PYTHONPATH=$SITE:$ROOT/usr/lib/python3/dist-packages PYTHONNOUSERSITE=1 \
        QEMU_LD_PREFIX=$ROOT QEMU_CPU=${QEMU_CPU:-max} qemu-s390x "$ROOT/usr/bin/python3.11" "$@"
}
if [ "${1:-}" = run ]; then
    shift
    run "$@"
    exit
fi

# numpy with its BLAS/LAPACK, yaml (gguf imports it)
if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    rm -rf "$ROOT"
    scripts/debian_python.sh s390x "$ROOT" python3-numpy libblas3 liblapack3 libgfortran5 python3-yaml libyaml-0-2
    # the links update-alternatives would make (no maintainer scripts ran)
    for lib in blas/libblas.so.3 lapack/liblapack.so.3; do ln -sf "$lib" "$ROOT/usr/lib/s390x-linux-gnu/"; done
fi

key=$(find plugins/src plugin_s390x/src plugin_s390x/pyproject.toml plugin_s390x/CMakeLists.txt native/src native/*.cmake \
    -type f -not -name '*.pyc' -not -path '*egg-info*' | sort | xargs sha1sum | sha1sum | cut -c1-16)
if [ "$(cat "$SITE/.installed" 2>/dev/null)" != "$key" ]; then
    rm -rf "$SITE"
    pip=(python3 -m pip install -q --root-user-action=ignore --no-deps --target "$SITE")
    "${pip[@]}" gguf tqdm pluggy ./plugins
    # its own CMake build directory: the plugin's default one holds the host's build
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$PWD/native/toolchains/s390x.cmake" \
        "${pip[@]}" --config-settings=build-dir="$ENV_DIR/build" ./plugin_s390x
    echo "$key" >"$SITE/.installed"
fi
run -c 'import platform, sys, numpy; print("s390x python", sys.version.split()[0], platform.machine(), sys.byteorder, "numpy", numpy.__version__)'
