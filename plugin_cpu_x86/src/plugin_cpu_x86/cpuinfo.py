"""What /proc/cpuinfo says about an x86 host: model, CPU count, ISA flags (no torch, no native code).

Thread binding and CPU lists are the CPU family's (:mod:`plugins.cpu`, :mod:`plugins.host`)."""

from __future__ import annotations

import os
import platform as _platform
from dataclasses import dataclass

from plugins.host import read_text

#: /proc/cpuinfo flag -> name shown in device_info
ISA_FLAGS = {
    "avx2": "AVX2",
    "fma": "FMA",
    "f16c": "F16C",
    "avx512f": "AVX512F",
    "avx512bw": "AVX512BW",
    "avx512vl": "AVX512VL",
    "avx512dq": "AVX512DQ",
    "avx512_vnni": "AVX512_VNNI",
    "avx512_bf16": "AVX512_BF16",
    "amx_tile": "AMX",
}
X86_MACHINES = ("x86_64", "amd64")


def machine() -> str:
    """The machine architecture name, lower case (``x86_64`` on this platform)."""
    return _platform.machine().lower()


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says about the host."""

    model: str
    num_logical: int
    flags: frozenset[str]

    @property
    def isa(self) -> list[str]:
        """The ISA extensions of :data:`ISA_FLAGS` this CPU has."""
        return [name for flag, name in ISA_FLAGS.items() if flag in self.flags]


def read_cpuinfo(path: str = "/proc/cpuinfo") -> CpuInfo:
    """Parse the first processor's model and flags and count the processors."""
    model, flags, count = "unknown x86_64 CPU", frozenset(), 0
    text = read_text(path)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            count += 1
        elif key == "model name" and count == 1:
            model = value.strip()
        elif key == "flags" and count == 1:
            flags = frozenset(value.split())
    return CpuInfo(model, count or os.cpu_count() or 1, flags)
