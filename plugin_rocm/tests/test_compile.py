"""plugin_cuda's Triton kernels compile ahead of time for AMD Instinct targets, without a GPU.

Triton's AMD backend lowers to AMDGCN and links the hsaco with its bundled LLVM/lld,
so no ROCm install or device is needed: gfx90a (MI200) and gfx942 (MI300) x bf16,
head size 128 by default; ``PLUGIN_ROCM_COMPILE_ALL=1`` adds fp16/fp32 and head
sizes 64/256. The check script is plugin_cuda's (``--arch gfx...``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("plugin_cuda")
if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    pytest.skip("TRITON_INTERPRET is set: the interpreter cannot compile for a GPU", allow_module_level=True)

SCRIPT = Path(__file__).parents[2] / "plugin_cuda" / "tests" / "compile_check.py"


def compile_all(archs, dtypes, head_sizes) -> list[str]:
    spec = importlib.util.spec_from_file_location("compile_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compile_all(archs, dtypes, head_sizes)


@pytest.mark.slow
def test_kernels_compile_for_mi200_and_mi300_bf16() -> None:
    assert compile_all(["gfx90a", "gfx942"], ["bf16"], [128]) == []


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PLUGIN_ROCM_COMPILE_ALL") != "1", reason="set PLUGIN_ROCM_COMPILE_ALL=1 (minutes)")
def test_kernels_compile_for_every_amd_target() -> None:
    assert compile_all(["gfx90a", "gfx942"], ["bf16", "fp16", "fp32"], [64, 128, 256]) == []
