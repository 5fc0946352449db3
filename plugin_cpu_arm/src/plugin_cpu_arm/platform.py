"""The ARM AArch64 CPU backend: Linux on aarch64 with NEON (Advanced SIMD)."""

from __future__ import annotations

import logging
import os
import platform as _platform
from typing import Any

import plugins
from plugins.cpu import CpuPlatform
from plugins.host import cpuinfo_features, read_text

logger = logging.getLogger(__name__)

#: ``/proc/cpuinfo`` feature names of the ISA extensions the kernels can use
ISA_FLAGS = {
    "neon": "asimd",
    "fp16": "asimdhp",
    "bf16": "bf16",
    "dotprod": "asimddp",
    "i8mm": "i8mm",
    "sve": "sve",
    "sve2": "sve2",
}


def probe(machine: str, cpuinfo: str) -> tuple[str | None, dict[str, bool]]:
    """Decide availability from ``platform.machine()`` and ``/proc/cpuinfo`` text.

    :return: ``(reason it is unavailable or None, ISA flags)``.
    """
    features = cpuinfo_features(cpuinfo)
    flags = {name: feature in features for name, feature in ISA_FLAGS.items()}
    if machine.lower() not in ("aarch64", "arm64"):
        return f"host CPU is {machine or 'unknown'}, not aarch64", flags
    if not flags["neon"]:
        return "aarch64 CPU without NEON (no 'asimd' in /proc/cpuinfo Features)", flags
    return None, flags


class CpuArmPlatform(CpuPlatform):
    """Runs on the host's ARM cores. The kernels are the SDK's torch reference ones;
    binding, ``CPU_*`` variables and KV budget are the CPU family's (:mod:`plugins.cpu`)."""

    name = "cpu_arm"
    api_version = 2
    # vLLM's ARM backend runs float32, float16 and bfloat16; bf16/fp16 speed needs the ISA
    supported_dtypes = ("float32", "bfloat16", "float16")

    def _probe(self) -> tuple[str | None, dict[str, bool]]:
        return probe(_platform.machine(), read_text("/proc/cpuinfo"))

    def unavailable_reason(self) -> str | None:
        return self._probe()[0]

    def device_info(self) -> dict[str, Any]:
        flags = self._probe()[1]
        return {"name": _platform.processor() or _platform.machine(), "count": os.cpu_count(), "isa": flags}

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        dtype = config.dtype
        if dtype in ("float16", "bfloat16"):
            flag = "fp16" if dtype == "float16" else "bf16"
            if not self._probe()[1][flag]:
                # torch still runs it, through slow conversions: say so, but allow it
                logger.warning("%s requested but this CPU lacks the %s extension", dtype, flag)
        return {}
