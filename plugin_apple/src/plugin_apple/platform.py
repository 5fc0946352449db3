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

logger = logging.getLogger(__name__)

MIN_MACOS = (12, 3)  # first macOS with the MPS backend
BF16_MACOS = (14, 0)  # MPS runs bfloat16 from macOS Sonoma on


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
        shown = ".".join(map(str, mac_version)) or "unknown"
        return f"macOS {shown}: MPS needs macOS 12.3 or later"
    if not has_torch:
        return "torch is not installed"
    if mps is False:
        return "torch.backends.mps.is_available() is False (torch built without MPS, or no Metal device)"
    return None


class MpsMemoryProfiler(MemoryProfiler):
    """Unified memory as Metal reports it; ``APPLE_KVCACHE_SPACE`` sizes the KV cache."""

    def total_memory(self) -> int:
        import torch

        return torch.mps.recommended_max_memory()

    def free_memory(self) -> int:
        import torch

        return max(0, torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())

    def measure_peak(self, profile_fn) -> int:
        # MPS keeps no peak statistic: the driver's allocation only grows within a profile run
        import torch

        before = torch.mps.driver_allocated_memory()
        profile_fn()
        torch.mps.synchronize()
        return max(0, torch.mps.driver_allocated_memory() - before)

    def kv_cache_budget(self, config: plugins.EngineConfigView, peak_activation_bytes: int) -> tuple[int, str]:
        space = self.platform.env["APPLE_KVCACHE_SPACE"]
        if config.kv_cache_bytes or space <= 0:
            return super().kv_cache_budget(config, peak_activation_bytes)
        return int(space * GiB), f"APPLE_KVCACHE_SPACE={space} GiB"


def watermark_ratio(text: str) -> float:
    """Parse ``PYTORCH_MPS_HIGH_WATERMARK_RATIO``-style values: 0 (no limit) up to 2."""
    value = float(text)
    if not 0 <= value <= 2:
        raise ValueError("expected a number between 0 (no limit) and 2")
    return value


class ApplePlatform(plugins.Platform):
    """Apple silicon GPUs through torch's MPS device."""

    name = "apple"
    device_type = "mps"
    priority = 50
    api_version = 2
    # bfloat16 works only from macOS 14 on: check_config rejects it before that
    supported_dtypes = ("float16", "float32")
    distributed_backend = "gloo"
    env_vars = (
        EnvVar("APPLE_MPS_HIGH_WATERMARK_RATIO", watermark_ratio, None, "sets PYTORCH_MPS_HIGH_WATERMARK_RATIO: cap on MPS allocations as a share of recommended memory (0 = none)"),
        EnvVar("APPLE_MPS_FALLBACK", bool, False, "sets PYTORCH_ENABLE_MPS_FALLBACK=1: run ops MPS lacks on the CPU instead of failing"),
        EnvVar("APPLE_KVCACHE_SPACE", float, 0.0, "KV cache size in GiB of unified memory; 0 lets the memory profiler decide"),
    )  # fmt: skip

    def unavailable_reason(self) -> str | None:
        return probe(
            _platform.system(),
            _platform.machine(),
            parse_version(_platform.mac_ver()[0]),
            importlib.util.find_spec("torch") is not None,
            torch_mps_available(),
        )

    def device_info(self) -> dict[str, Any]:
        version = parse_version(_platform.mac_ver()[0])
        info: dict[str, Any] = {"name": "Apple silicon GPU", "count": 1 if self.is_available() else 0}
        info["macos"] = ".".join(map(str, version)) or None
        info["bfloat16"] = bool(version) and version >= BF16_MACOS
        if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
            info["unified_memory_gib"] = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GiB, 1)
        return info

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        if config.dtype == "bfloat16":
            version = parse_version(_platform.mac_ver()[0])
            if version < BF16_MACOS:
                shown = ".".join(map(str, version)) or "unknown"
                raise ValueError(f"bfloat16 on MPS needs macOS 14 or later, this is macOS {shown}; use --dtype float16")
        return {}

    def init_device(self, config: plugins.EngineConfigView) -> None:
        # both variables are read when MPS first allocates, so they must be set before that
        mirrors = {"PYTORCH_MPS_HIGH_WATERMARK_RATIO": self.env["APPLE_MPS_HIGH_WATERMARK_RATIO"]}
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
