#!/usr/bin/env bash
# plugin_cuda on a lent NVIDIA GPU, in one device call of under 8 minutes (issue 43, deliverable 3).
#
#   device run, carry [".whl"], timeout_s 540:   bash bench/gpu_check.sh
#
# Installs the repo offline beside the image's python3 (torch, triton, transformers are the image's;
# the wheels core needs beyond them travel in .whl: plugin_cuda/GPU_CHECKLIST.md says how to fetch
# them), then: the device and versions; plugin_cuda's test suite with the conformance kit on the
# real device and greedy parity (bench/cuda_vs_transformers.py --check: tiny Qwen2 vs the reference
# platform, the default model's and Qwen2-0.5B's shapes vs transformers), after the benchmark
# (prefill, batch-1 decode vs the HBM floor, 64-way vs transformers) and a torch.profiler step profile.
# Logs and the JSON go to $OUT (the device tool brings them back); paste the figures into
# bench/RESULTS.md. GPU_CHECK_SKIP=check or =bench runs the other half alone.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site \
    ./plugins ./core ./plugin_cuda .whl/*.whl >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
    git log -1 --format='commit %h %s' 2>/dev/null || true
} 2>&1 | tee "$OUT/device.txt"
rc=0
if [[ ${GPU_CHECK_SKIP:-} != bench ]]; then
    timeout 330 python3 bench/cuda_vs_transformers.py --skip eager --budget-s 310 \
        --json "$OUT/cuda_vs_transformers.json" 2>&1 | tee "$OUT/bench.log" || rc=1
fi
if [[ ${GPU_CHECK_SKIP:-} != check ]]; then
    timeout 250 python3 bench/cuda_vs_transformers.py --check \
        --pytest-args "plugin_cuda/tests -q -rs --timeout 120 -p no:cacheprovider" 2>&1 | tee "$OUT/check.log" || rc=1
fi
exit $rc
