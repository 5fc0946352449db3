"""The Google TPU backend: torch_xla installed and a TPU attached to this VM."""

from __future__ import annotations

import functools
import glob
import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any

import plugins
from plugins import EnvVar
from plugins.memory import GiB, MemoryProfiler, gpu_kv_budget, host_memory

logger = logging.getLogger(__name__)


def probe(
    has_torch_xla: bool, accel: list[str], vfio: list[str], environ: Mapping[str, str], allow_cpu: bool = False
) -> str | None:
    """Why the platform is unavailable, or None.

    TPU v2-v4 VMs expose ``/dev/accel0``...; v5e and later expose the chips through
    VFIO, where ``/dev/vfio`` alone could be any device, so a TPU runtime variable
    (``TPU_ACCELERATOR_TYPE``, or ``PJRT_DEVICE=TPU``) must confirm it. ``allow_cpu``
    (``CORE_TPU_ALLOW_CPU=1``) accepts torch_xla's CPU device instead of a TPU.
    """
    if not has_torch_xla:
        return "torch_xla is not installed"
    if accel or allow_cpu:
        return None
    tpu_env = bool(environ.get("TPU_ACCELERATOR_TYPE")) or environ.get("PJRT_DEVICE", "").upper() == "TPU"
    if vfio and tpu_env:
        return None
    if vfio:
        return "/dev/vfio devices found but no TPU_ACCELERATOR_TYPE or PJRT_DEVICE=TPU says they are TPUs"
    return "no TPU found: no /dev/accel* device and no /dev/vfio device (CORE_TPU_ALLOW_CPU=1 runs on XLA:CPU)"


def memory_info(info: Mapping[str, int]) -> tuple[int, int]:
    """``(total, free)`` bytes from ``xm.get_memory_info()``, whose keys changed across
    torch_xla versions (``bytes_limit``/``bytes_used``, earlier ``kb_total``/``kb_free``)."""
    if "bytes_limit" in info:
        return info["bytes_limit"], info["bytes_limit"] - info["bytes_used"]
    if "kb_total" in info:
        return info["kb_total"] * 1024, info["kb_free"] * 1024
    raise ValueError(f"unrecognised torch_xla memory info keys: {sorted(info)}")


class XlaMemoryProfiler(MemoryProfiler):
    """KV cache sized from the TPU's HBM as torch_xla reports it.

    No profile pass: the warm-up compiles and runs every bucket after the KV cache is
    allocated, so the activations of the largest bucket must fit in the
    ``1 - gpu_memory_utilization`` share. On XLA:CPU, whose PJRT client has no
    allocator statistics (``GetAllocatorStats is not supported``), the host-memory
    default applies.
    """

    needs_profile_run = False

    def _info(self) -> tuple[int, int]:
        import torch_xla.core.xla_model as xm

        return memory_info(xm.get_memory_info(xm.xla_device()))

    def total_memory(self) -> int:
        return host_memory()[0] if self.platform.on_cpu else self._info()[0]

    def free_memory(self) -> int:
        return host_memory()[1] if self.platform.on_cpu else self._info()[1]

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
        """Zeros made on the host and copied: zeros made on the device would be a pending
        computation folded into the first graph that runs (which then differs from the next)."""
        import torch

        return torch.zeros(shape, dtype=dtype).to(device)

    def kv_cache_budget(self, config: plugins.EngineConfigView, peak_activation_bytes: int) -> tuple[int, str]:
        """``config.kv_cache_bytes`` if set; else ``gpu_memory_utilization`` of the HBM
        minus what is in use now (the weights)."""
        if self.platform.on_cpu or config.kv_cache_bytes:
            return super().kv_cache_budget(config, peak_activation_bytes)
        total, free = self._info()
        budget = gpu_kv_budget(total, free, 0, config.gpu_memory_utilization)
        return budget, (
            f"{config.gpu_memory_utilization:.0%} of {total / GiB:.1f} GiB HBM minus {(total - free) / GiB:.2f} GiB in use"
        )


class TpuPlatform(plugins.Platform):
    """TPUs through torch_xla/PJRT: padded static shapes, compiled-graph cache on disk."""

    name = "tpu"
    device_type = "xla"
    priority = 90
    api_version = 2
    supported_dtypes = ("bfloat16", "float32")
    distributed_backend = "xla"
    ray_device_key = "TPU"
    env_vars = (
        EnvVar("XLA_CACHE_PATH", str, "~/.cache/core/xla_cache", "directory of the persistent XLA compilation cache"),
        EnvVar("TPU_BUCKET_PADDING_GAP", int, 0, "0: pad token counts to powers of two; N: to multiples of N above N"),
        EnvVar("TPU_ALLOW_CPU", bool, False, "1: without a TPU, run on torch_xla's CPU device (tests; slow)"),
        EnvVar("TPU_PALLAS", bool, True, "on a TPU, attention through torch_xla's Pallas kernel (0: pure torch ops)"),
    )

    def _reason(self, allow_cpu: bool) -> str | None:
        return probe(
            importlib.util.find_spec("torch_xla") is not None,
            sorted(glob.glob("/dev/accel[0-9]*")),
            sorted(glob.glob("/dev/vfio/[0-9]*")),
            os.environ,
            allow_cpu,
        )

    def unavailable_reason(self) -> str | None:
        return self._reason(self.env["TPU_ALLOW_CPU"])

    @functools.cached_property
    def on_cpu(self) -> bool:
        """Whether this runs on XLA:CPU: no TPU found and ``CORE_TPU_ALLOW_CPU=1``."""
        return self.env["TPU_ALLOW_CPU"] and self._reason(False) is not None

    def device_info(self) -> dict[str, Any]:
        if self.on_cpu:
            return {"name": "XLA:CPU (CORE_TPU_ALLOW_CPU=1)", "count": 1}
        chips = sorted(glob.glob("/dev/accel[0-9]*")) or sorted(glob.glob("/dev/vfio/[0-9]*"))
        return {"name": os.environ.get("TPU_ACCELERATOR_TYPE") or "TPU", "count": len(chips)}

    def init_device(self, config: plugins.EngineConfigView) -> None:
        if self.on_cpu:
            os.environ.setdefault("PJRT_DEVICE", "CPU")
            logger.warning("no TPU: running on torch_xla's CPU device (CORE_TPU_ALLOW_CPU=1), for tests, not speed")
        import torch_xla
        import torch_xla.runtime as xr

        path = os.path.expanduser(self.env["XLA_CACHE_PATH"])
        # once per process, before the first computation (a second engine in the process reuses it)
        if torch_xla._XLAC._xla_computation_cache_is_initialized():
            logger.debug("XLA compilation cache already initialised in this process")
            return
        os.makedirs(path, exist_ok=True)
        xr.initialize_cache(path, readonly=False)
        logger.info("XLA compilation cache at %s", path)

    def torch_device(self):
        import torch_xla

        return torch_xla.device()

    def synchronize(self) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()

    def metrics(self) -> dict[str, float]:
        """``xla_compilations``: graphs compiled by this process (a rise while serving is a recompile)."""
        from plugin_tpu.runner import compile_count

        return {"xla_compilations": compile_count()}

    def make_kernels(self):
        from plugin_tpu.kernels import XlaKernels

        return XlaKernels(use_pallas=self.env["TPU_PALLAS"] and not self.on_cpu)

    def make_memory_profiler(self):
        return XlaMemoryProfiler(self)

    def make_runner(self):
        from plugin_tpu.runner import TpuRunner

        return TpuRunner(self)
