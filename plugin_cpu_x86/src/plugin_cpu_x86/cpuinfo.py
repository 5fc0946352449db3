"""Host facts from /proc and /sys, and the thread-binding plan (no torch, no native code)."""

from __future__ import annotations

import os
import platform as _platform
from dataclasses import dataclass
from pathlib import Path

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
    try:
        text = Path(path).read_text()
    except OSError:
        return CpuInfo(model, os.cpu_count() or 1, flags)
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


def parse_cpu_list(text: str) -> list[int]:
    """Parse ``"0-3,8,10-11"`` into sorted CPU ids; raises ValueError on a bad item."""
    cpus: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        first, sep, last = item.partition("-")
        lo, hi = int(first), int(last) if sep else int(first)
        if lo < 0 or hi < lo:
            raise ValueError(f"bad CPU range {item!r}")
        cpus.update(range(lo, hi + 1))
    if not cpus:
        raise ValueError(f"no CPU ids in {text!r}")
    return sorted(cpus)


def parse_threads_bind(text: str) -> str:
    """Validate a CPU_OMP_THREADS_BIND value: ``auto``, ``all`` or ``list|list|...``."""
    value = text.strip()
    if value in ("auto", "all"):
        return value
    for part in value.split("|"):
        parse_cpu_list(part)
    return value


def _sys_cpu_lists(pattern: str) -> list[list[int]]:
    lists = []
    for path in sorted(Path("/sys/devices/system").glob(pattern)):
        try:
            lists.append(parse_cpu_list(path.read_text()))
        except (OSError, ValueError):
            continue
    return lists


def physical_cores(cpus: list[int]) -> list[int]:
    """One logical CPU (the first hyper-thread sibling) per physical core among ``cpus``."""
    keep = []
    for cpu in cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            first = parse_cpu_list(path.read_text())[0]
        except (OSError, ValueError):
            first = cpu
        if first == cpu or first not in cpus:
            keep.append(cpu)
    return keep


def plan_compute_cpus(bind: str, num_reserved: int, rank: int, allowed: list[int]) -> list[int]:
    """The CPUs the engine's compute threads of ``rank`` run on.

    ``auto``: the physical cores of NUMA node ``rank`` (modulo the node count) that
    this process may use, minus the last ``num_reserved`` (left to the front end).
    ``all``: every allowed CPU. Otherwise ``bind`` lists CPUs per rank, ``|``-separated.

    :raises ValueError: no CPU left, a rank without a list, or a CPU not allowed.
    """
    if bind == "all":
        return list(allowed)
    if bind == "auto":
        nodes = [[c for c in node if c in allowed] for node in _sys_cpu_lists("node/node*/cpulist")]
        nodes = [node for node in nodes if node] or [list(allowed)]
        cores = physical_cores(nodes[rank % len(nodes)])
        chosen = cores[: len(cores) - num_reserved] if num_reserved > 0 else cores
        if not chosen:
            raise ValueError(
                f"CPU_NUM_OF_RESERVED_CPU={num_reserved} leaves no core for compute "
                f"(rank {rank} has {len(cores)} cores: {cores})"
            )
        return chosen
    parts = bind.split("|")
    if rank >= len(parts):
        raise ValueError(f"CPU_OMP_THREADS_BIND={bind!r} has {len(parts)} lists, none for rank {rank}")
    chosen = parse_cpu_list(parts[rank])
    missing = [c for c in chosen if c not in allowed]
    if missing:
        raise ValueError(f"CPU_OMP_THREADS_BIND lists CPUs {missing} this process may not use (allowed: {allowed})")
    return chosen
