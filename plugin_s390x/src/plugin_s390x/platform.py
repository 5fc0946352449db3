"""The IBM Z backend: Linux on s390x with the vector facility and its z14 enhancements."""

from __future__ import annotations

import os
import platform as _platform
import re
from typing import Any

import plugins
from plugins.cpu import CpuPlatform
from plugins.host import cpuinfo_features, read_text

#: machine type numbers of ``/proc/cpuinfo`` and the IBM Z generation they belong to
MACHINE_GENERATIONS = {
    "2964": "z13", "2965": "z13s", "3906": "z14", "3907": "z14 ZR1", "8561": "z15",
    "8562": "z15 T02", "3931": "z16", "3932": "z16 A02", "9175": "z17",
}  # fmt: skip
#: ``/proc/cpuinfo`` features: vector facility (z13), enhancements 1 (z14) and 2 (z15)
ISA_FLAGS = {"vx": "vx", "vxe": "vxe", "vxe2": "vxe2", "nnpa": "nnpa"}


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


class S390xPlatform(CpuPlatform):
    """Runs on the host's IBM Z cores. The kernels are the SDK's torch reference ones;
    binding, ``CPU_*`` variables and KV budget are the CPU family's (:mod:`plugins.cpu`).

    s390x is big-endian while safetensors and GGUF files are little-endian:
    :meth:`device_info` reports the host byte order; no loader hook converts weights yet.
    """

    name = "s390x"
    api_version = 2
    # vLLM's s390x backend runs float32 only
    supported_dtypes = ("float32",)

    def _probe(self) -> tuple[str | None, dict[str, Any]]:
        return probe(_platform.machine(), read_text("/proc/cpuinfo"))

    def unavailable_reason(self) -> str | None:
        return self._probe()[0]

    def device_info(self) -> dict[str, Any]:
        info = self._probe()[1]
        return {
            "name": info.pop("machine") or _platform.machine(),
            "count": os.cpu_count(),
            "isa": info,
            "byte_order": "big",
        }

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        dtype = config.dtype
        if dtype not in ("auto", "float32"):
            raise ValueError(f"s390x runs float32 only, got dtype={dtype!r}; use --dtype float32 or auto")
        return {}
