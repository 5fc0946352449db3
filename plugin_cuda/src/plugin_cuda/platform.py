"""The NVIDIA GPU platform: detection, device facts, config checks, and its parts."""

from __future__ import annotations

import functools
import logging
from typing import Any, ClassVar

import plugins
from plugins.memory import GiB

from plugin_cuda import detect
from plugin_cuda.settings import ENV_VARS

logger = logging.getLogger(__name__)


class CudaPlatform(plugins.Platform):
    """NVIDIA GPUs through torch's CUDA build: Triton kernels, CUDA graphs, GPU memory planning."""

    name = "cuda"
    device_type = "cuda"
    priority = 100
    api_version = 2
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    #: FP8 caches run the SDK's torch reference kernels (not the Triton ones)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("fp8_e4m3", "fp8_e5m2")
    distributed_backend = "nccl"
    ray_device_key = "GPU"
    env_vars = ENV_VARS

    @functools.cached_property
    def _probe(self) -> str | None:
        return detect.probe()

    def unavailable_reason(self) -> str | None:
        """None when torch is a CUDA build and an NVIDIA device is present (no torch import);
        else e.g. ``"torch 2.13.0+cpu is a CPU-only build"``, ``"no NVIDIA device found ..."``."""
        return self._probe

    def device_info(self) -> dict[str, Any]:
        """Name, count, memory and compute capability of the visible GPUs (empty if unavailable)."""
        if not self.is_available():
            return {}
        import torch

        count = torch.cuda.device_count()
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        if not props:
            return {"count": 0}
        first = props[0]
        return {
            "name": first.name,
            "count": count,
            "memory_gib": round(first.total_memory / GiB, 1),
            "compute_capability": f"{first.major}.{first.minor}",
            "multiprocessors": first.multi_processor_count,
            "torch_cuda": torch.version.cuda,
            "devices": [p.name for p in props] if len({p.name for p in props}) > 1 else None,
        }

    def compute_capability(self) -> tuple[int, int]:
        """``(major, minor)`` of the current device."""
        import torch

        return torch.cuda.get_device_capability()

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        """Reject bfloat16 on GPUs before Ampere (compute capability < 8.0) with the reason."""
        dtype = config.dtype
        if dtype in ("bfloat16", "auto") and self.is_available():
            major, minor = self.compute_capability()
            if major < 8:
                if dtype == "auto":
                    logger.info("cuda: compute capability %d.%d has no bfloat16; using float16", major, minor)
                    return {"dtype": "float16"}
                raise ValueError(
                    f"dtype bfloat16 needs compute capability >= 8.0 (Ampere); this GPU is "
                    f"{major}.{minor}: use --dtype float16 or float32"
                )
        return {}

    def default_max_num_batched_tokens(self, config: plugins.EngineConfigView) -> int:
        """8192 tokens a step (vLLM's GPU default): a GPU step of 8192 tokens takes about what a
        2048-token one does in launches and host work, so a 64x128 prefill runs in one step, not four."""
        return 8192

    def init_device(self, config: plugins.EngineConfigView) -> None:
        """Select the GPU (``config.local_rank``) and initialise CUDA."""
        import torch

        torch.cuda.set_device(config.local_rank)
        torch.cuda.init()

    def torch_device(self):
        """The current CUDA device."""
        import torch

        return torch.device("cuda", torch.cuda.current_device())

    def synchronize(self) -> None:
        """Wait for all queued work on the current device."""
        import torch

        torch.cuda.synchronize()

    def make_kernels(self):
        """Triton kernels, or the torch reference where the env asks for it."""
        from plugins.gpu_triton.kernels import TritonKernels

        return TritonKernels(
            attention_backend=self.env["CUDA_ATTENTION_BACKEND"],
            ops_backend=self.env["CUDA_KERNELS"],
            decode_split_tokens=self.env["CUDA_DECODE_SPLIT_TOKENS"],
            skinny_gemm=self.env["CUDA_SKINNY_GEMM"],
        )

    def make_memory_profiler(self):
        """GPU memory accounting (``torch.cuda.mem_get_info``, peak allocator stats)."""
        from plugin_cuda.memory import CudaMemoryProfiler

        return CudaMemoryProfiler(self)

    def make_runner(self):
        """CUDA graphs over decode batch sizes; eager for prefill and larger batches."""
        from plugin_cuda.runner import CudaGraphRunner

        return CudaGraphRunner(self)
