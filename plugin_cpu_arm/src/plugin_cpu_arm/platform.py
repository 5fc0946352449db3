"""The ARM AArch64 CPU backend: Linux on aarch64 with NEON (Advanced SIMD).

Its kernels, their library and the fused runner are native/'s, shared with cpu_x86 and
s390x (:class:`plugins.cpu_native.platform.NativeCpuPlatform`); binding, the ``CPU_*``
variables and the KV budget are the CPU family's (:class:`plugins.cpu.CpuPlatform`).
"""

from __future__ import annotations

import logging
import os
import platform as _platform
from typing import Any

import plugins
from plugins.cpu_native.library import IsaTable
from plugins.cpu_native.platform import NativeCpuPlatform, native_env_vars
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

#: the library's variants (native/src/features_aarch64.cpp), features named as ISA_FLAGS' keys
ISA_TABLE = IsaTable(
    module="plugin_cpu_arm._carm",
    feature_bits=("neon", "fp16", "dotprod", "bf16", "sve"),
    requirements={
        "neon_bf16": ("neon", "dotprod", "fp16", "bf16"),
        "neon_dotprod": ("neon", "dotprod"),
        "neon": ("neon",),
        "scalar": (),
    },
    choices={
        "auto": ("neon_bf16", "neon_dotprod", "neon", "scalar"),
        "neon_bf16": ("neon_bf16",),
        "neon_dotprod": ("neon_dotprod",),
        "neon": ("neon",),
        "scalar": ("scalar",),
    },
)


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


class CpuArmPlatform(NativeCpuPlatform):
    """Runs on the host's ARM cores: NEON kernels (with dot product, fp16 and bf16 where
    the CPU has them) or portable C++, chosen from the kernel's hwcaps."""

    name = "cpu_arm"
    api_version = 2
    # vLLM's ARM backend runs float32, float16 and bfloat16; bf16/fp16 speed needs the ISA
    supported_dtypes = ("float32", "bfloat16", "float16")
    isa_table = ISA_TABLE
    env_vars = native_env_vars(ISA_TABLE)

    def _probe(self) -> tuple[str | None, dict[str, bool]]:
        return probe(_platform.machine(), read_text("/proc/cpuinfo"))

    def host_unavailable_reason(self) -> str | None:
        return self._probe()[0]

    def device_info(self) -> dict[str, Any]:
        flags = self._probe()[1]
        return {
            "name": _platform.processor() or _platform.machine(),
            "count": os.cpu_count(),
            "isa": flags,
            "kernel_isa": self.kernel_isa([name for name, present in flags.items() if present]),
        }

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        dtype = config.dtype
        if dtype in ("float16", "bfloat16"):
            flag = "fp16" if dtype == "float16" else "bf16"
            if not self._probe()[1][flag]:
                # torch still runs it, through slow conversions: say so, but allow it
                logger.warning("%s requested but this CPU lacks the %s extension", dtype, flag)
        return {}
