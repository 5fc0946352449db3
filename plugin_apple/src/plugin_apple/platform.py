"""The Apple silicon backend: torch's MPS device on macOS arm64.

Detection and torch: asking ``torch.backends.mps.is_available()`` means importing
torch (about a second), which ``core devices`` should not pay for every plugin. So
:meth:`ApplePlatform.is_available` asks torch only when torch is already imported;
otherwise it decides from macOS >= 12.3 on arm64 with torch installed, because every
macOS arm64 torch wheel is built with MPS. :meth:`ApplePlatform.init_device` then
asks torch and raises :class:`plugins.PlatformUnavailable` with torch's answer if
the Metal device is not there after all (a VM without GPU passthrough).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform as _platform
import sys
from typing import Any

import plugins
from plugins import EnvVar
from plugins.memory import GiB, MemoryProfiler

from plugin_apple.mps_rules import (
    BF16_MACOS,
    HIGH_VAR,
    LOW_VAR,
    MIN_MACOS,
    Watermarks,
    dtype_unsupported_reason,
    resolve_watermarks,
    show_version,
    supported_dtypes,
    unified_kv_budget,
    watermark_ratio,
)

logger = logging.getLogger(__name__)


def parse_version(text: str) -> tuple[int, ...]:
    """``"14.5.1"`` -> ``(14, 5, 1)``; ``""`` (not macOS) -> ``()``."""
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def torch_mps_available() -> bool | None:
    """torch's own answer when torch is already imported, else None (not asked)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return bool(torch.backends.mps.is_available())


def probe(system: str, machine: str, mac_version: tuple[int, ...], has_torch: bool, mps: bool | None) -> str | None:
    """Why the platform is unavailable, or None."""
    if system != "Darwin":
        return f"not macOS (this is {system or 'an unknown OS'}); MPS exists only on Apple silicon Macs"
    if machine != "arm64":
        return f"macOS on {machine}: MPS needs Apple silicon (arm64)"
    if mac_version < MIN_MACOS:
        return f"macOS {show_version(mac_version)}: MPS needs macOS 12.3 or later"
    if not has_torch:
        return "torch is not installed"
    if mps is False:
        return "torch.backends.mps.is_available() is False (torch built without MPS, or no Metal device)"
    return None


class MpsMemoryProfiler(MemoryProfiler):
    """Unified memory as Metal reports it, budgeted under the MPS watermarks.

    The KV budget is ``config.kv_cache_bytes`` when set, else ``APPLE_KVCACHE_SPACE``
    GiB when set (refused when it would pass the high watermark, where MPS allocations
    fail), else :func:`plugin_apple.mps_rules.unified_kv_budget` at the engine's
    ``gpu_memory_utilization``.

    :param device: the namespace of the memory calls (default ``torch.mps``):
        ``recommended_max_memory``, ``driver_allocated_memory``, ``synchronize``.
    """

    def __init__(self, platform: Any, device: Any = None) -> None:
        super().__init__(platform)
        if device is None:
            import torch

            device = torch.mps
        self.device = device

    def total_memory(self) -> int:
        return self.device.recommended_max_memory()

    def free_memory(self) -> int:
        return max(0, self.device.recommended_max_memory() - self.device.driver_allocated_memory())

    def measure_peak(self, profile_fn) -> int:
        # MPS keeps no peak statistic: the driver's allocation only grows within a profile run
        before = self.device.driver_allocated_memory()
        profile_fn()
        self.device.synchronize()
        return max(0, self.device.driver_allocated_memory() - before)

    def kv_cache_budget(self, config: plugins.EngineConfigView, peak_activation_bytes: int) -> tuple[int, str]:
        if config.kv_cache_bytes:
            return super().kv_cache_budget(config, peak_activation_bytes)
        recommended, allocated = self.device.recommended_max_memory(), self.device.driver_allocated_memory()
        watermarks = self.platform.watermarks()
        space = self.platform.env["APPLE_KVCACHE_SPACE"]
        if space > 0:
            budget, in_use = int(space * GiB), allocated + peak_activation_bytes
            limit = watermarks.limit(watermarks.high, recommended)
            if limit is not None and in_use + budget > limit:
                raise ValueError(
                    f"APPLE_KVCACHE_SPACE={space} GiB does not fit: with {in_use / GiB:.2f} GiB in use it passes "
                    f"the MPS high watermark {watermarks.high} x {recommended / GiB:.1f} GiB = {limit / GiB:.2f} GiB, "
                    "where allocations fail"
                )
            return budget, f"APPLE_KVCACHE_SPACE={space} GiB"
        utilization = config.gpu_memory_utilization
        return unified_kv_budget(recommended, allocated, peak_activation_bytes, utilization, watermarks)


class ApplePlatform(plugins.Platform):
    """Apple silicon GPUs through torch's MPS device."""

    name = "apple"
    device_type = "mps"
    priority = 50
    api_version = 2
    distributed_backend = "gloo"
    env_vars = (
        EnvVar("APPLE_MPS_HIGH_WATERMARK_RATIO", watermark_ratio, None, "sets PYTORCH_MPS_HIGH_WATERMARK_RATIO: hard cap on MPS allocations as a multiple of the recommended working set (0 = none; default 1.7)"),
        EnvVar("APPLE_MPS_LOW_WATERMARK_RATIO", watermark_ratio, None, "sets PYTORCH_MPS_LOW_WATERMARK_RATIO: above it MPS collects garbage more often (0 = off; default 1.4; at most the high ratio)"),
        EnvVar("APPLE_MPS_FALLBACK", bool, False, "sets PYTORCH_ENABLE_MPS_FALLBACK=1: run ops MPS lacks on the CPU instead of failing"),
        EnvVar("APPLE_KVCACHE_SPACE", float, 0.0, "KV cache size in GiB of unified memory; 0 lets the memory profiler decide"),
    )  # fmt: skip

    @property
    def mac_version(self) -> tuple[int, ...]:
        """This machine's macOS version, ``()`` elsewhere."""
        return parse_version(_platform.mac_ver()[0])

    @property
    def supported_dtypes(self) -> tuple[str, ...]:  # type: ignore[override]  (depends on the macOS)
        # below macOS 12.3 (or off a Mac) the platform is unavailable: it would run the minimum's
        return supported_dtypes(max(self.mac_version, MIN_MACOS))

    def torch_watermark_env(self) -> dict[str, str]:
        """The PyTorch watermark variables MPS will read: those already set win over the
        ``APPLE_`` ones that :meth:`init_device` exports."""
        result = {}
        for torch_name, name in (
            (HIGH_VAR, "APPLE_MPS_HIGH_WATERMARK_RATIO"),
            (LOW_VAR, "APPLE_MPS_LOW_WATERMARK_RATIO"),
        ):
            if torch_name in os.environ:
                result[torch_name] = os.environ[torch_name]
            elif self.env[name] is not None:
                result[torch_name] = str(self.env[name])
        return result

    def watermarks(self) -> Watermarks:
        """The MPS allocator's watermarks under this environment (see :mod:`plugin_apple.mps_rules`).

        :raises ValueError: a ratio PyTorch would refuse, naming the variable.
        """
        return resolve_watermarks(self.torch_watermark_env())

    def unavailable_reason(self) -> str | None:
        return probe(
            _platform.system(),
            _platform.machine(),
            self.mac_version,
            importlib.util.find_spec("torch") is not None,
            torch_mps_available(),
        )

    def device_info(self) -> dict[str, Any]:
        version = self.mac_version
        info: dict[str, Any] = {"name": "Apple silicon GPU", "count": 1 if self.is_available() else 0}
        info["macos"] = ".".join(map(str, version)) or None
        info["bfloat16"] = bool(version) and version >= BF16_MACOS
        if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
            info["unified_memory_gib"] = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GiB, 1)
        return info

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        if config.dtype != "auto":
            reason = dtype_unsupported_reason(config.dtype, self.mac_version)
            if reason is not None:
                raise ValueError(f"{reason}; use --dtype float16")
        self.watermarks()  # PyTorch would refuse them only at the first allocation
        return {}

    def init_device(self, config: plugins.EngineConfigView) -> None:
        # both variables are read when MPS first allocates, so they must be set before that
        mirrors = {
            HIGH_VAR: self.env["APPLE_MPS_HIGH_WATERMARK_RATIO"],
            LOW_VAR: self.env["APPLE_MPS_LOW_WATERMARK_RATIO"],
        }
        mirrors["PYTORCH_ENABLE_MPS_FALLBACK"] = "1" if self.env["APPLE_MPS_FALLBACK"] else None
        for name, value in mirrors.items():
            if value is not None and os.environ.setdefault(name, str(value)) != str(value):
                logger.warning("%s=%s is already set and wins over the APPLE_ variable", name, os.environ[name])
        import torch

        if not torch.backends.mps.is_available():
            raise plugins.PlatformUnavailable(
                f"apple: torch.backends.mps.is_available() is False (built with MPS: {torch.backends.mps.is_built()})"
            )

    def synchronize(self) -> None:
        import torch

        torch.mps.synchronize()

    def make_memory_profiler(self):
        return MpsMemoryProfiler(self)
