#!/usr/bin/env bash
# `make test-xpu-compile`: every shared Triton kernel (plugins.gpu_triton) compiled to SPIR-V for
# Intel GPU targets, the Data Center GPU Max (pvc) and Arc A-series (dg2), without a device.
# Arguments: passed to `python -m plugins.gpu_triton.compile_check` instead of the defaults.
#
# Intel's Triton (triton-xpu) installs under the import name `triton`, so it gets its own venv,
# built once under $CORE_TEST_XPU_CACHE (default ~/.cache/core-test-xpu-compile), outside the
# clone, keyed by the pinned versions: torch (the CPU wheel: the kernels' wrappers import torch),
# triton-xpu, and intel-sycl-rt (the SYCL headers and libsycl its backend's helper is built
# against). That helper also links Level Zero's loader: Debian's libze1/libze-dev, fetched with
# `apt-get download` (no root) and unpacked into the venv. The SDK is reinstalled only when its
# files change (a hash of them is the stamp); compiled kernels are cached by Triton in $CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS="torch==2.13.0 triton-xpu==3.3.0b1 intel-sycl-rt==2026.2.0"
CACHE=${CORE_TEST_XPU_CACHE:-$HOME/.cache/core-test-xpu-compile}
VENV="$CACHE/venv-$(echo "$PINS" | sha256sum | cut -c1-12)"
PY="$VENV/bin/python"
PIP="$PY -m pip --disable-pip-version-check -q"

if [ ! -f "$VENV/.ready" ]; then
    echo "test-xpu-compile: building $VENV ($PINS, a few minutes the first time)"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    $PIP install -U pip setuptools wheel
    $PIP install $PINS pluggy numpy
    # Level Zero's loader (libze_loader.so) and headers, from the distribution's packages
    DEBS=$(mktemp -d)
    (cd "$DEBS" && apt-get download libze1 libze-dev >/dev/null) || {
        echo "test-xpu-compile: 'apt-get download libze1 libze-dev' failed: Debian/Ubuntu's Level Zero loader" \
            "is needed (no package lists? run apt-get update)" >&2
        exit 1
    }
    for deb in "$DEBS"/*.deb; do dpkg-deb -x "$deb" "$DEBS/root"; done
    cp -a "$DEBS"/root/usr/lib/*/libze_loader.so* "$VENV/lib/"  # on the -L and rpath Triton's helper build uses
    cp -a "$DEBS/root/usr/include/level_zero" "$VENV/include/"
    rm -rf "$DEBS"
    # the PyPI CUDA build of torch would bring NVIDIA's triton under the same import name
    $PY -c 'import os, triton, torch; assert os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "intel")), triton.__file__; assert torch.version.cuda is None, torch.__version__' \
        || { echo "test-xpu-compile: triton in $VENV is not Intel's (torch pulled another in?)" >&2; exit 1; }
    touch "$VENV/.ready"
fi

# the SDK's files (tracked, or on disk outside git) -> one hash: reinstall only when it changes
FILES=$( (git ls-files plugins scripts/test-xpu-compile.sh 2>/dev/null || find plugins -type f) | sort)
STAMP=$(cat $FILES | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.project-stamp" 2>/dev/null)" != "$STAMP" ]; then
    echo "test-xpu-compile: installing plugins into $VENV"
    $PIP install --no-build-isolation --force-reinstall --no-deps ./plugins
    echo "$STAMP" > "$VENV/.project-stamp"
fi

$PY -c 'import torch, triton; print("test-xpu-compile: torch", torch.__version__, "triton (Intel XPU)", triton.__version__)'
export CC=${CC:-g++}  # the backend's helper is C++: gcc would not link libstdc++
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$CACHE/triton-cache}
if [ $# -eq 0 ]; then
    set -- --arch pvc dg2 --dtype bf16 fp16 fp32 --head-size 128
fi
# run outside the clone so that the installed SDK is imported, not ./plugins
cd "$CACHE"
exec env -u TRITON_INTERPRET "$PY" -m plugins.gpu_triton.compile_check "$@"
