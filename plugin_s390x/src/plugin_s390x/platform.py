"""The IBM Z backend: Linux on s390x with the vector facility and its z14 enhancements.

Its kernels, their library and the fused runner are native/'s, shared with cpu_x86 and
cpu_arm (:class:`plugins.cpu_native.platform.NativeCpuPlatform`); binding, the ``CPU_*``
variables and the KV budget are the CPU family's (:class:`plugins.cpu.CpuPlatform`).
"""

from __future__ import annotations

import os
import platform as _platform
import re
from typing import Any

import plugins
from plugins.cpu_native.library import IsaTable
from plugins.cpu_native.platform import NativeCpuPlatform, native_env_vars
from plugins.host import cpuinfo_features, read_text

#: machine type numbers of ``/proc/cpuinfo`` and the IBM Z generation they belong to
MACHINE_GENERATIONS = {
    "2964": "z13", "2965": "z13s", "3906": "z14", "3907": "z14 ZR1", "8561": "z15",
    "8562": "z15 T02", "3931": "z16", "3932": "z16 A02", "9175": "z17",
}  # fmt: skip
#: ``/proc/cpuinfo`` features: vector facility (z13), enhancements 1 (z14) and 2 (z15)
ISA_FLAGS = {"vx": "vx", "vxe": "vxe", "vxe2": "vxe2", "nnpa": "nnpa"}
#: the library's variants (native/src/features_s390x.cpp), features named as ISA_FLAGS' keys
ISA_TABLE = IsaTable(
    module="plugin_s390x._cs390x",
    feature_bits=("vx", "vxe", "vxe2"),
    requirements={"z15": ("vx", "vxe", "vxe2"), "z14": ("vx", "vxe"), "scalar": ()},
    choices={"auto": ("z15", "z14", "scalar"), "z15": ("z15",), "z14": ("z14",), "scalar": ("scalar",)},
)


def probe(machine: str, cpuinfo: str) -> tuple[str | None, dict[str, Any]]:
    """Decide availability from ``platform.machine()`` and ``/proc/cpuinfo`` text.

    Requires ``vx`` and ``vxe``: the kernels target z14 (``-march=z14 -mzvector``), as
    vLLM's s390x build does ("VXE support, z14 and later").

    :return: ``(reason it is unavailable or None, ISA flags and machine generation)``.
    """
    features = cpuinfo_features(cpuinfo)
    info: dict[str, Any] = {name: feature in features for name, feature in ISA_FLAGS.items()}
    found = re.search(r"machine\s*=\s*(\w+)", cpuinfo)
    info["machine"] = MACHINE_GENERATIONS.get(found.group(1), found.group(1)) if found else None
    if machine.lower() != "s390x":
        return f"host CPU is {machine or 'unknown'}, not s390x", info
    if not info["vx"]:
        return "s390x CPU without the vector facility (no 'vx' in /proc/cpuinfo features)", info
    if not info["vxe"]:
        return (
            f"s390x CPU ({info['machine'] or 'unknown machine'}) without vector enhancements 'vxe': z14 or later needed",
            info,
        )
    return None, info


class S390xPlatform(NativeCpuPlatform):
    """Runs on the host's IBM Z cores: z vector kernels (z14; z15 adds int <-> float
    conversions) or portable C++, chosen from the kernel's hwcaps.

    s390x is big-endian while safetensors and GGUF files are little-endian:
    :attr:`byte_order` makes core's loader convert GGUF weights (safetensors' reader
    converts on its own).
    """

    name = "s390x"
    api_version = 2
    # vLLM's s390x backend runs float32 only
    supported_dtypes = ("float32",)
    byte_order = "big"
    isa_table = ISA_TABLE
    env_vars = native_env_vars(ISA_TABLE)

    def _probe(self) -> tuple[str | None, dict[str, Any]]:
        return probe(_platform.machine(), read_text("/proc/cpuinfo"))

    def host_unavailable_reason(self) -> str | None:
        return self._probe()[0]

    def device_info(self) -> dict[str, Any]:
        info = self._probe()[1]
        return {
            "name": info.pop("machine") or _platform.machine(),
            "count": os.cpu_count(),
            "isa": info,
            "kernel_isa": self.kernel_isa([name for name, present in info.items() if present]),
            "byte_order": self.byte_order,
        }

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        dtype = config.dtype
        if dtype not in ("auto", "float32"):
            raise ValueError(f"s390x runs float32 only, got dtype={dtype!r}; use --dtype float32 or auto")
        return {}
