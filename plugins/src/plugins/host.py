"""Facts about the host read from ``/proc`` and ``/sys``: small files, CPU lists, CPU
topology and the CPUs this process may use. Pure Python, nothing heavy imported.
"""

from __future__ import annotations

import os
from pathlib import Path

SYS_CPU = "/sys/devices/system"


def read_text(path: str) -> str:
    """A small system file's text, or ``""`` when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def parse_cpu_list(text: str) -> list[int]:
    """Parse a Linux CPU list such as ``0-3,8,10-11`` into sorted, unique CPU ids.

    :raises ValueError: on an empty list, a malformed item or a reversed range.
    """
    cpus: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ValueError(f"empty item in CPU list {text!r}")
        first, sep, last = item.partition("-")
        if not (first.isdigit() and (not sep or last.isdigit())):
            raise ValueError(f"{item!r} is not a CPU id or range like 0-7")
        lo, hi = int(first), int(last) if sep else int(first)
        if hi < lo:
            raise ValueError(f"reversed CPU range {item!r}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def cpuinfo_features(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` text (any architecture)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("features", "flags"):
            return set(value.split())
    return set()


def hwcaps() -> tuple[int, int]:
    """The kernel's ``AT_HWCAP`` and ``AT_HWCAP2`` words for this process (``getauxval``).

    Under qemu-user they describe the emulated CPU, where ``/proc/cpuinfo`` is the host's.
    """
    import ctypes

    getauxval = ctypes.CDLL(None).getauxval
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return getauxval(16), getauxval(26)


def numa_nodes(root: str = SYS_CPU) -> list[list[int]]:
    """The CPU list of each NUMA node, in node order (empty when sysfs has none)."""
    nodes = []
    for path in sorted(Path(root).glob("node/node*/cpulist"), key=lambda p: int(p.parent.name[4:])):
        try:
            nodes.append(parse_cpu_list(path.read_text()))
        except (OSError, ValueError):
            continue
    return nodes


def first_sibling(cpu: int, root: str = SYS_CPU) -> int:
    """The first hyper-thread sibling of ``cpu`` (``cpu`` itself when sysfs does not say)."""
    try:
        return parse_cpu_list(read_text(f"{root}/cpu/cpu{cpu}/topology/thread_siblings_list"))[0]
    except ValueError:
        return cpu


_process_cpus: list[int] | None = None
#: carries :func:`process_cpus` to the processes this one starts (they inherit its environment)
PROCESS_CPUS_ENV = "CORE_PROCESS_CPUS"


def process_cpus() -> list[int]:
    """The CPUs this process may use, as read before the first thread binding.

    Binding pins the calling thread; a thread it starts later (the server's engine
    thread) and a second engine built in the same thread would otherwise take that
    pinned set for all the process has (a second ``LLM`` would plan, and decode on, one core).
    A process started from a pinned thread inherits the pin, so the set is also handed down
    (:data:`PROCESS_CPUS_ENV`): tensor-parallel workers spawned after an engine ran in their
    parent still share their parent's CPUs, one core each on two, rather than its one pinned core.
    """
    global _process_cpus
    if _process_cpus is None:
        inherited = os.environ.get(PROCESS_CPUS_ENV)
        _process_cpus = parse_cpu_list(inherited) if inherited else sorted(os.sched_getaffinity(0))
        os.environ[PROCESS_CPUS_ENV] = ",".join(map(str, _process_cpus))
    return _process_cpus
