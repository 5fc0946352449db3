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
from plugins.host import hwcaps

logger = logging.getLogger(__name__)

#: the ISA extensions the kernels can use, by their ``/proc/cpuinfo`` feature names
ISA_FLAGS = {
    "neon": "asimd",
    "fp16": "asimdhp",
    "bf16": "bf16",
    "dotprod": "asimddp",
    "i8mm": "i8mm",
    "sve": "sve",
    "sve2": "sve2",
}
#: ``AT_HWCAP`` / ``AT_HWCAP2`` bits (Linux arch/arm64/include/uapi/asm/hwcap.h) by the same names
HWCAP_NAMES = {1 << 1: "asimd", 1 << 10: "asimdhp", 1 << 20: "asimddp", 1 << 22: "sve"}
HWCAP2_NAMES = {1 << 1: "sve2", 1 << 13: "i8mm", 1 << 14: "bf16"}

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


def hwcap_features(hwcap: int, hwcap2: int) -> set[str]:
    """The feature names of :data:`ISA_FLAGS` that the hwcap words report."""
    words = ((hwcap, HWCAP_NAMES), (hwcap2, HWCAP2_NAMES))
    return {name for word, names in words for bit, name in names.items() if word & bit}


def probe(machine: str, features: set[str]) -> tuple[str | None, dict[str, bool]]:
    """Decide availability from ``platform.machine()`` and the CPU's feature names (those of
    ``/proc/cpuinfo``; read from the hwcaps, which qemu-user emulates and cpuinfo it does not).

    :return: ``(reason it is unavailable or None, ISA flags)``.
    """
    if machine.lower() not in ("aarch64", "arm64"):
        return f"host CPU is {machine or 'unknown'}, not aarch64", dict.fromkeys(ISA_FLAGS, False)
    flags = {name: feature in features for name, feature in ISA_FLAGS.items()}
    if not flags["neon"]:
        return "aarch64 CPU without NEON (no 'asimd' in the kernel's hwcaps)", flags
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
        return probe(_platform.machine(), hwcap_features(*hwcaps()))

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
