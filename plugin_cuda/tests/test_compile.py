"""The Triton kernels compile to cubin for NVIDIA GPUs (no GPU needed; see
:mod:`plugins.gpu_triton.compile_check`).

By default one target (sm_90, bfloat16: what the interpreter cannot check) keeps the
suite fast; ``PLUGIN_CUDA_COMPILE_ALL=1`` compiles sm_80/86/90 x bf16/fp16/fp32 x
head sizes 64/128/256 (a few minutes on 2 cores).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def run_check(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return subprocess.run(
        [sys.executable, "-m", "plugins.gpu_triton.compile_check", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


@pytest.mark.slow
def test_kernels_compile_for_hopper_bf16() -> None:
    result = run_check("--arch", "90", "--dtype", "bf16", "--head-size", "128")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PLUGIN_CUDA_COMPILE_ALL") != "1", reason="set PLUGIN_CUDA_COMPILE_ALL=1 (minutes)")
def test_kernels_compile_for_every_target() -> None:
    result = run_check("--arch", "80", "86", "90", "--dtype", "bf16", "fp16", "fp32", "--head-size", "64", "128", "256")
    assert result.returncode == 0, result.stdout + result.stderr
