"""The conformance kit on the CPU: the cuda platform's Triton kernels under Triton's
interpreter, fp32 and fp16 (the interpreter gets bf16 wrong), eager runner."""

import os
from typing import ClassVar

import pytest
import torch
from plugin_cuda.platform import CudaPlatform
from plugins.gpu_triton.kernels import TritonKernels
from plugins.runner import Runner
from plugins.testing import PlatformConformance

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the real thing in test_conformance.py")


class InterpretedCudaPlatform(CudaPlatform):
    """The cuda platform's kernels on CPU tensors (TRITON_INTERPRET=1, set by conftest)."""

    name = "cuda_interpreted"
    device_type = "cpu"
    distributed_backend = "gloo"  # its tensors are CPU tensors: nccl needs CUDA ones
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16")

    def is_available(self) -> bool:
        return True

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

    def make_kernels(self):
        return TritonKernels(decode_split_tokens=16, num_sms=4)

    def make_memory_profiler(self):
        from plugins.memory import MemoryProfiler

        return MemoryProfiler(self)

    def make_runner(self):
        return Runner(self)


class TestConformanceInterpreted(PlatformConformance):
    platform = InterpretedCudaPlatform

    @pytest.mark.slow
    @pytest.mark.skipif(
        os.environ.get("PLUGIN_CUDA_INTERPRETED_E2E") != "1",
        reason="set PLUGIN_CUDA_INTERPRETED_E2E=1: end-to-end generation under the interpreter takes ~6 min",
    )
    def test_greedy_generation_matches_reference(self, device_plat, tmp_path) -> None:
        super().test_greedy_generation_matches_reference(device_plat, tmp_path)
