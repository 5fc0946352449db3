"""The shared Triton kernels (plugins.gpu_triton) compile ahead of time for AMD Instinct targets, without a GPU.

Triton's AMD backend lowers to AMDGCN and links the hsaco with its bundled LLVM/lld,
so no ROCm install or device is needed: gfx90a (MI200) and gfx942 (MI300) x bf16,
head size 128 by default; ``PLUGIN_ROCM_COMPILE_ALL=1`` adds fp16/fp32 and head
sizes 64/256. The check is the shared kernels' (:mod:`plugins.gpu_triton.compile_check`).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    pytest.skip("TRITON_INTERPRET is set: the interpreter cannot compile for a GPU", allow_module_level=True)

from plugins.gpu_triton.compile_check import compile_all  # noqa: E402  (after the skips)


@pytest.mark.slow
def test_kernels_compile_for_mi200_and_mi300_bf16() -> None:
    assert compile_all(["gfx90a", "gfx942"], ["bf16"], [128]) == []


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PLUGIN_ROCM_COMPILE_ALL") != "1", reason="set PLUGIN_ROCM_COMPILE_ALL=1 (minutes)")
def test_kernels_compile_for_every_amd_target() -> None:
    assert compile_all(["gfx90a", "gfx942"], ["bf16", "fp16", "fp32"], [64, 128, 256]) == []
