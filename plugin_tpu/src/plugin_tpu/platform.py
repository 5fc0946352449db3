"""The Google TPU backend: torch_xla installed and a TPU attached to this VM."""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any

import plugins
from plugins import EnvVar
from plugins.memory import MemoryProfiler

logger = logging.getLogger(__name__)


def probe(has_torch_xla: bool, accel: list[str], vfio: list[str], environ: Mapping[str, str]) -> str | None:
    """Why the platform is unavailable, or None.

    TPU v2-v4 VMs expose ``/dev/accel0``...; v5e and later expose the chips through
    VFIO, where ``/dev/vfio`` alone could be any device, so a TPU runtime variable
    (``TPU_ACCELERATOR_TYPE``, or ``PJRT_DEVICE=TPU``) must confirm it.
    """
    if not has_torch_xla:
        return "torch_xla is not installed"
    if accel:
        return None
    tpu_env = bool(environ.get("TPU_ACCELERATOR_TYPE")) or environ.get("PJRT_DEVICE", "").upper() == "TPU"
    if vfio and tpu_env:
        return None
    if vfio:
        return "/dev/vfio devices found but no TPU_ACCELERATOR_TYPE or PJRT_DEVICE=TPU says they are TPUs"
    return "no TPU found: no /dev/accel* device and no /dev/vfio device"


def memory_info(info: Mapping[str, int]) -> tuple[int, int]:
    """``(total, free)`` bytes from ``xm.get_memory_info()``, whose keys changed across
    torch_xla versions (``bytes_limit``/``bytes_used``, earlier ``kb_total``/``kb_free``)."""
    if "bytes_limit" in info:
        return info["bytes_limit"], info["bytes_limit"] - info["bytes_used"]
    if "kb_total" in info:
        return info["kb_total"] * 1024, info["kb_free"] * 1024
    raise ValueError(f"unrecognised torch_xla memory info keys: {sorted(info)}")


class XlaMemoryProfiler(MemoryProfiler):
    """TPU HBM as torch_xla reports it for the current device."""

    def _info(self) -> tuple[int, int]:
        import torch_xla.core.xla_model as xm

        return memory_info(xm.get_memory_info(xm.xla_device()))

    def total_memory(self) -> int:
        return self._info()[0]

    def free_memory(self) -> int:
        return self._info()[1]

    def measure_peak(self, profile_fn) -> int:
        before = self.free_memory()
        profile_fn()
        self.platform.synchronize()
        return max(0, before - self.free_memory())


class TpuPlatform(plugins.Platform):
    """TPUs through torch_xla/PJRT: padded static shapes, compiled-graph cache on disk."""

    name = "tpu"
    device_type = "xla"
    priority = 90
    api_version = 2
    supported_dtypes = ("bfloat16", "float32")
    distributed_backend = "xla"
    env_vars = (
        EnvVar("XLA_CACHE_PATH", str, "~/.cache/core/xla_cache", "directory of the persistent XLA compilation cache"),
        EnvVar("TPU_BUCKET_PADDING_GAP", int, 0, "0: pad token counts to powers of two; N: to multiples of N above N"),
    )

    def unavailable_reason(self) -> str | None:
        return probe(
            importlib.util.find_spec("torch_xla") is not None,
            sorted(glob.glob("/dev/accel[0-9]*")),
            sorted(glob.glob("/dev/vfio/[0-9]*")),
            os.environ,
        )

    def device_info(self) -> dict[str, Any]:
        chips = sorted(glob.glob("/dev/accel[0-9]*")) or sorted(glob.glob("/dev/vfio/[0-9]*"))
        return {"name": os.environ.get("TPU_ACCELERATOR_TYPE") or "TPU", "count": len(chips)}

    def init_device(self, config: plugins.EngineConfigView) -> None:
        import torch_xla.runtime as xr

        path = os.path.expanduser(self.env["XLA_CACHE_PATH"])
        os.makedirs(path, exist_ok=True)
        xr.initialize_cache(path, readonly=False)
        logger.info("XLA compilation cache at %s", path)

    def torch_device(self):
        import torch_xla.core.xla_model as xm

        return xm.xla_device()

    def synchronize(self) -> None:
        import torch_xla.core.xla_model as xm

        xm.mark_step()
        xm.wait_device_ops()

    def make_memory_profiler(self):
        return XlaMemoryProfiler(self)

    def make_runner(self):
        from plugin_tpu.runner import TpuRunner

        return TpuRunner(self)
