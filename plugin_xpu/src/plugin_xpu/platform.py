"""The Intel GPU backend: torch's XPU build (SYCL on Level Zero) and the shared Triton kernels.

Detection reads ``torch.version.xpu`` from ``torch/version.py`` as text (None in builds
without XPU, such as the CPU wheel) and Intel's selector variables without importing
torch; only an XPU build is then asked ``torch.xpu.device_count()``.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import plugins
from plugins import EnvVar
from plugins.env import parse_fraction
from plugins.host import read_text
from plugins.memory import DeviceMemoryProfiler, GiB

from plugin_xpu.selectors import device_env, selector_reason

logger = logging.getLogger(__name__)

#: where Intel GPU builds of torch come from (they bring Intel's Triton, pytorch-triton-xpu)
XPU_WHEELS = "https://download.pytorch.org/whl/xpu"


def torch_version_field(version_py: str, field: str) -> str | None:
    """The string value of ``field`` (``__version__``, ``xpu``) in ``torch/version.py`` text, or None."""
    found = re.search(rf"^{field}\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", version_py, re.MULTILINE)
    return found.group(1) if found else None


def installed_torch_version_py() -> str | None:
    """Text of the installed ``torch/version.py`` (found, not imported); None without torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return read_text(os.path.join(next(iter(spec.submodule_search_locations)), "version.py"))


def probe(version_py: str | None, environ: Mapping[str, str], device_count: Callable[[], int]) -> str | None:
    """Why the platform is unavailable, or None (pure but for ``device_count``, asked last).

    :param version_py: the text of ``torch/version.py``; None when torch is not installed.
    :param device_count: ``torch.xpu.device_count`` (called only for an XPU build).
    """
    if version_py is None:
        return "torch is not installed"
    version = torch_version_field(version_py, "__version__") or "unknown"
    if torch_version_field(version_py, "xpu") is None:
        return f"torch {version} is not an XPU build (torch.version.xpu is None; Intel GPU wheels: {XPU_WHEELS})"
    hidden = selector_reason(environ)
    if hidden is not None:
        return hidden
    if device_count() == 0:
        return (
            f"torch {version} is an XPU build but torch.xpu.device_count() is 0: no Intel GPU, or no "
            "Level Zero driver (intel-level-zero-gpu) or /dev/dri render node in this process"
        )
    return None


def is_data_center_gpu(name: str) -> bool:
    """Whether a device name is an Intel Data Center GPU (Max, Flex), where bfloat16 runs."""
    return "Data Center GPU" in name


class XpuMemoryProfiler(DeviceMemoryProfiler):
    """GPU memory through ``torch.xpu`` (CUDA's API names); KV budget = total * utilization - used."""

    torch_module = "xpu"
    utilization_var = "XPU_GPU_MEMORY_UTILIZATION"


class XpuPlatform(plugins.Platform):
    """Intel Data Center GPU Max / Flex and Arc GPUs through torch's XPU build."""

    name = "xpu"
    device_type = "xpu"
    priority = 100
    api_version = 2
    #: float16 first (the ``auto`` dtype, as vLLM's XPU backend); bfloat16 only on Data
    #: Center GPUs (check_config), not on Arc
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32")
    distributed_backend = "xccl"  # torch's oneCCL collectives on XPU (torch >= 2.8)
    ray_device_key = "GPU"  # Ray counts Intel GPUs as GPU and sets ONEAPI_DEVICE_SELECTOR per worker
    env_vars = (
        EnvVar("XPU_GPU_MEMORY_UTILIZATION", parse_fraction, None, "share of GPU memory for weights, activations and KV cache; when set it wins over --gpu-memory-utilization"),
        EnvVar("XPU_VISIBLE_DEVICES", str, None, "GPU indices (N, or N.M for a tile) to use, exported as ZE_AFFINITY_MASK before the runtime starts"),
        EnvVar("XPU_KERNELS", str, "triton", "attention, norm, rotary, activation and KV-write kernels: the shared Triton kernels or the torch reference", choices=("triton", "reference")),
    )  # fmt: skip

    @functools.cached_property
    def _probe(self) -> str | None:
        try:
            return probe(installed_torch_version_py(), os.environ, _torch_xpu_device_count)
        except Exception as exc:  # detection must never break discovery
            return f"detection failed: {type(exc).__name__}: {exc}"

    def unavailable_reason(self) -> str | None:
        """None when torch is an XPU build that sees an Intel GPU; else why not (e.g.
        ``"torch 2.13.0+cpu is not an XPU build (torch.version.xpu is None; ...)"``)."""
        return self._probe

    def _properties(self) -> list[Any]:
        import torch

        return [torch.xpu.get_device_properties(i) for i in range(torch.xpu.device_count())]

    def device_info(self) -> dict[str, Any]:
        """Name, count, memory, Xe-cores of the visible GPUs and the selectors in force (empty if unavailable)."""
        if not self.is_available():
            return {}
        import torch

        props = self._properties()
        first = props[0]
        return {
            "name": first.name,
            "count": len(props),
            "memory_gib": round(first.total_memory / GiB, 1),
            "xe_cores": first.gpu_subslice_count,
            "driver": first.driver_version,
            "bfloat16": is_data_center_gpu(first.name),
            "torch_xpu": torch.version.xpu,
            "selectors": {k: os.environ[k] for k in ("ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK") if k in os.environ},
        }

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        """Reject bfloat16 on GPUs other than Data Center GPUs (Arc), with the reason."""
        if config.dtype == "bfloat16" and self.is_available():
            others = sorted({p.name for p in self._properties() if not is_data_center_gpu(p.name)})
            if others:
                raise ValueError(
                    f"dtype bfloat16 runs on Intel Data Center GPUs (Max, Flex) only, not on {', '.join(others)}: "
                    "use --dtype float16 (the default) or float32"
                )
        return {}

    def init_device(self, config: plugins.EngineConfigView) -> None:
        """Export ``XPU_VISIBLE_DEVICES`` as ``ZE_AFFINITY_MASK``, then select the GPU ``config.local_rank``."""
        os.environ.update(device_env(self.env["XPU_VISIBLE_DEVICES"], os.environ))
        import torch

        torch.xpu.set_device(config.local_rank)
        torch.xpu.init()

    def torch_device(self):
        """The current XPU device."""
        import torch

        return torch.device("xpu", torch.xpu.current_device())

    def synchronize(self) -> None:
        """Wait for all queued work on the current device."""
        import torch

        torch.xpu.synchronize()

    def make_kernels(self):
        """The shared Triton kernels (Intel's Triton compiles them to SPIR-V), splits sized for
        the GPU's Xe-cores; decode products through torch (oneDNN), not the skinny GEMM, whose
        chooser times with CUDA graphs."""
        from plugins.gpu_triton.kernels import TritonKernels

        backend = self.env["XPU_KERNELS"]
        return TritonKernels(
            attention_backend=backend, ops_backend=backend, num_sms=self.num_xe_cores(), skinny_gemm=None
        )

    def num_xe_cores(self) -> int:
        """Xe-cores of the first GPU (``gpu_subslice_count``): what split-K decode attention fills."""
        return self._properties()[0].gpu_subslice_count

    def make_memory_profiler(self):
        """GPU memory accounting through ``torch.xpu`` (``mem_get_info``, peak allocator stats)."""
        return XpuMemoryProfiler(self)


def _torch_xpu_device_count() -> int:
    import torch

    return torch.xpu.device_count()
