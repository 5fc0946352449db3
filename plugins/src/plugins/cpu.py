"""Host-CPU pieces shared by the CPU backends: the ``CPU_*`` variables, thread binding
and a KV-cache budget that honours ``CPU_KVCACHE_SPACE``.

The variable names and meanings are vLLM's (``VLLM_CPU_KVCACHE_SPACE``,
``VLLM_CPU_OMP_THREADS_BIND``, ``VLLM_CPU_NUM_OF_RESERVED_CPU``), read as ``CORE_*``
with the ``VLLM_*`` spelling as a fallback. Everything here is pure or reads only
``/proc`` and the scheduler affinity, so it imports nothing heavy.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from plugins.env import EnvVar
from plugins.memory import GiB, MemoryProfiler

logger = logging.getLogger(__name__)

_BIND_KEYWORDS = ("auto", "all", "nobind")


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


def threads_bind(text: str) -> str:
    """Validate a ``CPU_OMP_THREADS_BIND`` value and return it normalized.

    Accepted: ``auto`` (the allowed CPUs minus the reserved ones), ``all`` (every
    allowed CPU), ``nobind`` (leave threads alone), or one CPU list per rank separated
    by ``|``, e.g. ``0-31|32-63``.
    """
    value = text.strip().lower()
    if value in _BIND_KEYWORDS:
        return value
    for rank_list in value.split("|"):
        parse_cpu_list(rank_list)
    return value


def cpu_env_vars() -> tuple[EnvVar, ...]:
    """The ``CPU_*`` variables every CPU backend declares."""
    return (
        EnvVar("CPU_KVCACHE_SPACE", float, 0.0, "KV cache size in GiB; 0 lets the memory profiler decide"),
        EnvVar(
            "CPU_OMP_THREADS_BIND",
            threads_bind,
            "auto",
            "CPUs for the compute threads: auto, all, nobind, or per-rank lists like 0-31|32-63",
        ),
        EnvVar("CPU_NUM_OF_RESERVED_CPU", int, 0, "CPUs left free for the server front end with auto binding"),
    )


def select_cpus(spec: str, allowed: list[int], rank: int = 0, num_reserved: int = 0) -> list[int] | None:
    """The CPUs the compute threads of ``rank`` bind to, or None to leave them unbound.

    :param spec: a :func:`threads_bind`-normalized ``CPU_OMP_THREADS_BIND`` value.
    :param allowed: the CPUs this process may run on (its scheduler affinity).
    :param num_reserved: with ``auto``, how many of the highest allowed CPUs to leave free.
    :raises ValueError: when the spec names no list for ``rank``, names CPUs outside
        ``allowed``, or reserves every CPU.
    """
    if spec == "nobind":
        return None
    if spec == "all":
        return sorted(allowed)
    if spec == "auto":
        if num_reserved < 0 or num_reserved >= len(allowed):
            raise ValueError(f"CPU_NUM_OF_RESERVED_CPU={num_reserved} leaves no CPU of {len(allowed)} for compute")
        return sorted(allowed)[: len(allowed) - num_reserved]
    per_rank = spec.split("|")
    if rank >= len(per_rank):
        raise ValueError(f"CPU_OMP_THREADS_BIND={spec!r} has {len(per_rank)} CPU list(s), none for rank {rank}")
    cpus = parse_cpu_list(per_rank[rank])
    outside = sorted(set(cpus) - set(allowed))
    if outside:
        raise ValueError(f"CPU_OMP_THREADS_BIND names CPUs {outside} this process may not use (allowed: {allowed})")
    return cpus


def bind_threads(env: dict[str, Any], config: Any) -> list[int] | None:
    """Pin the calling thread (and the OpenMP threads it starts) and size torch's pool."""
    allowed = sorted(os.sched_getaffinity(0))
    cpus = select_cpus(env["CPU_OMP_THREADS_BIND"], allowed, getattr(config, "rank", 0), env["CPU_NUM_OF_RESERVED_CPU"])
    if cpus is None:
        logger.info("CPU thread binding disabled (CPU_OMP_THREADS_BIND=nobind)")
        return None
    import torch

    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    logger.info("bound %d compute threads to CPUs %s", len(cpus), cpus)
    return cpus


def cpuinfo_features(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` text (any architecture)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("features", "flags"):
            return set(value.split())
    return set()


def read_text(path: str) -> str:
    """A small system file's text, or ``""`` when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


class CpuMemoryProfiler(MemoryProfiler):
    """Host memory, with the KV cache sized by ``CPU_KVCACHE_SPACE`` when it is set."""

    def kv_cache_budget(self, config: Any, peak_activation_bytes: int) -> tuple[int, str]:
        if getattr(config, "kv_cache_bytes", None):
            return super().kv_cache_budget(config, peak_activation_bytes)
        space = self.platform.env["CPU_KVCACHE_SPACE"]
        if space <= 0:
            return super().kv_cache_budget(config, peak_activation_bytes)
        budget = int(space * GiB)
        free = self.free_memory() - peak_activation_bytes
        if budget > free:
            logger.warning("CPU_KVCACHE_SPACE=%s GiB exceeds the %.1f GiB of free host memory", space, free / GiB)
        return budget, f"CPU_KVCACHE_SPACE={space} GiB"
