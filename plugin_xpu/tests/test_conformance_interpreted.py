"""The conformance kit on the CPU: xpu's kernel set (the shared Triton kernels as
``make_kernels`` configures them, no skinny GEMM) under Triton's interpreter, fp16 and
fp32 (the interpreter gets bf16 wrong), eager runner."""

import os
from typing import ClassVar

import pytest
import torch
from plugin_xpu.platform import XpuPlatform
from plugins.testing import PlatformConformance

pytestmark = pytest.mark.skipif(torch.xpu.is_available(), reason="a GPU runs the real thing in test_conformance.py")


class InterpretedXpuPlatform(XpuPlatform):
    """The xpu platform's kernels on CPU tensors (TRITON_INTERPRET=1, set by conftest)."""

    name = "xpu_interpreted"
    device_type = "cpu"
    distributed_backend = "gloo"  # its tensors are CPU tensors: xccl needs XPU ones
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float16", "float32")

    def unavailable_reason(self) -> None:
        return None

    def device_info(self) -> dict:
        return {"interpreter": True}

    def check_config(self, config) -> dict:
        return {}

    def init_device(self, config) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def torch_device(self):
        return torch.device("cpu")

    def num_xe_cores(self) -> int:
        return 4

    def make_memory_profiler(self):
        from plugins.memory import MemoryProfiler

        return MemoryProfiler(self)


class TestConformanceInterpreted(PlatformConformance):
    platform = InterpretedXpuPlatform

    @pytest.mark.slow
    @pytest.mark.skipif(
        os.environ.get("PLUGIN_XPU_INTERPRETED_E2E") != "1",
        reason="set PLUGIN_XPU_INTERPRETED_E2E=1: end-to-end generation under the interpreter takes minutes",
    )
    def test_greedy_generation_matches_reference(self, device_plat, tmp_path) -> None:
        super().test_greedy_generation_matches_reference(device_plat, tmp_path)
