"""Memory profiling and KV-cache planning.

The engine loads the weights, asks the platform's :class:`MemoryProfiler` to measure
a profile forward pass at the largest batch (unless the profiler says its budget does
not need one: :attr:`MemoryProfiler.needs_profile_run`), then to turn what is left into
a number of KV-cache blocks. The default here works for any host-memory device: it budgets a
fixed number of bytes (``kv_cache_bytes`` of the engine config, else a quarter of
the available host memory, at most 4 GiB). :class:`DeviceMemoryProfiler` is the base of
GPU-style devices whose torch namespace has CUDA's memory API (``torch.cuda`` for CUDA
and ROCm, ``torch.hpu`` for Gaudi); the host-CPU family's is :class:`plugins.cpu.CpuMemoryProfiler`.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from plugins.config import EngineConfigView

MiB = 1 << 20
GiB = 1 << 30


def host_memory() -> tuple[int, int]:
    """``(total, available)`` bytes of host memory, from ``/proc/meminfo`` or sysconf."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemTotal"], info.get("MemAvailable", info["MemFree"])
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page


@dataclass(frozen=True)
class KVCachePlan:
    """How many KV blocks to allocate, and the reasoning a user can check in the log."""

    num_blocks: int
    budget_bytes: int
    block_bytes: int
    detail: str


class MemoryProfiler:
    """Reports device memory and sizes the KV cache. Override for device memory APIs."""

    #: Whether the KV budget needs the activation peak of a profile forward pass at the
    #: largest batch: the engine runs that pass (through :meth:`measure_peak`) only when
    #: True, and passes a peak of 0 otherwise. A host-memory profiler whose budget is a
    #: fixed size or a share of free memory that leaves room for the activations may say
    #: False: on a CPU that pass is the longest part of start-up.
    needs_profile_run: bool = True

    def __init__(self, platform: Any) -> None:
        self.platform = platform

    def total_memory(self) -> int:
        """Bytes of memory of the device (default: host memory)."""
        return host_memory()[0]

    def free_memory(self) -> int:
        """Bytes currently free on the device (default: available host memory)."""
        return host_memory()[1]

    def measure_peak(self, profile_fn: Callable[[], None]) -> int:
        """Run ``profile_fn`` and return the peak extra bytes it needed (>= 0).

        The default reads the process's peak resident set before and after, which
        only grows, so it reports 0 when the profile fits in memory already touched.
        """
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        profile_fn()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, after - before)

    def kv_cache_budget(self, config: EngineConfigView, peak_activation_bytes: int) -> tuple[int, str]:
        """Return ``(bytes for the KV cache, how that number was chosen)``.

        ``config.kv_cache_bytes`` (set by the user) wins; otherwise a quarter of the
        free memory, capped at 4 GiB.
        """
        requested = config.kv_cache_bytes
        if requested:
            return int(requested), f"{requested / GiB:.2f} GiB requested"
        free = self.free_memory() - peak_activation_bytes
        budget = max(0, min(4 * GiB, free // 4))
        return budget, f"min(4 GiB, 25% of {free / GiB:.1f} GiB free after activations)"

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
        """One layer's K or V cache of ``shape`` (``[num_blocks, *block]``, from the platform's
        :class:`plugins.kv_cache.KVCacheLayout`; by default ``[num_blocks, block_size, kv_heads, head_size]``).

        The default zeroes it. A platform whose attention reads only the slots written
        before (positions below each sequence's length) may return it uninitialized: on
        the host its pages are then faulted in as the cache fills, not all at start-up.
        """
        import torch

        return torch.zeros(shape, dtype=dtype, device=device)

    def plan_kv_cache(self, config: EngineConfigView, block_bytes: int, peak_activation_bytes: int = 0) -> KVCachePlan:
        """Turn the budget into whole blocks of ``block_bytes`` (all layers, K and V)."""
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        budget, why = self.kv_cache_budget(config, peak_activation_bytes)
        num_blocks = budget // block_bytes
        detail = f"KV cache {budget / GiB:.2f} GiB ({why}) = {num_blocks} blocks of {block_bytes / MiB:.2f} MiB"
        return KVCachePlan(num_blocks=num_blocks, budget_bytes=budget, block_bytes=block_bytes, detail=detail)


def gpu_kv_budget(total: int, free: int, peak_activation_bytes: int, utilization: float) -> int:
    """vLLM's GPU rule: ``total * utilization`` minus what is in use (weights, other
    processes) and the profile pass's peak activations; never negative."""
    return max(0, int(total * utilization) - (total - free) - peak_activation_bytes)


class DeviceMemoryProfiler(MemoryProfiler):
    """GPU-style device memory through a torch namespace with CUDA's memory API.

    ``mem_get_info``, ``memory_allocated``, ``max_memory_allocated``,
    ``reset_peak_memory_stats`` and ``synchronize`` (``empty_cache`` when it has one) are
    called on :attr:`device`: ``torch.<torch_module>`` by default, or the object given
    (tests pass a fake). The KV budget is ``config.kv_cache_bytes`` when set, else
    :meth:`device_budget` at the :meth:`utilization`.

    :param device: the namespace the memory calls go to (default ``torch.<torch_module>``).
    """

    #: the torch namespace of the device's memory API: ``"cuda"`` (CUDA and ROCm), ``"hpu"``
    torch_module: ClassVar[str] = "cuda"
    #: name of the platform's :class:`plugins.EnvVar` that, when set, wins over the
    #: engine's ``gpu_memory_utilization`` (None: the engine's setting only)
    utilization_var: ClassVar[str | None] = None

    def __init__(self, platform: Any, device: Any = None) -> None:
        super().__init__(platform)
        if device is None:
            import torch

            device = getattr(torch, self.torch_module)
        self.device = device
        #: bytes allocated before the profile forward (the weights), once measured
        self.weights_bytes: int | None = None

    def total_memory(self) -> int:
        return self.device.mem_get_info()[1]

    def free_memory(self) -> int:
        return self.device.mem_get_info()[0]

    def measure_peak(self, profile_fn: Callable[[], None]) -> int:
        """Peak bytes the profile forward allocates beyond what was allocated before it."""
        self.device.synchronize()
        self.device.reset_peak_memory_stats()
        self.weights_bytes = self.device.memory_allocated()
        profile_fn()
        self.device.synchronize()
        peak = max(0, self.device.max_memory_allocated() - self.weights_bytes)
        if hasattr(self.device, "empty_cache"):  # the profile's cached blocks go back, for the KV cache
            self.device.empty_cache()
        return peak

    def utilization(self, config: EngineConfigView) -> tuple[float, str]:
        """``(fraction of device memory to plan for, where it came from)``: the variable
        :attr:`utilization_var` when it is set, else the engine's ``gpu_memory_utilization``."""
        if self.utilization_var is not None:
            var = next(v for v in self.platform.env_vars if v.name == self.utilization_var)
            found = var.raw(os.environ)
            if found is not None:
                return var.read(), found[0]
        return config.gpu_memory_utilization, "gpu_memory_utilization"

    def device_budget(
        self, config: EngineConfigView, peak_activation_bytes: int, utilization: float
    ) -> tuple[int, str]:
        """(optional) override: ``(KV bytes, how)`` at ``utilization``; default :func:`gpu_kv_budget`."""
        free, total = self.device.mem_get_info()
        budget = gpu_kv_budget(total, free, peak_activation_bytes, utilization)
        used = (total - free + peak_activation_bytes) / GiB
        return budget, f"{utilization:.0%} of {total / GiB:.1f} GiB minus {used:.2f} GiB in use"

    def kv_cache_budget(self, config: EngineConfigView, peak_activation_bytes: int) -> tuple[int, str]:
        if config.kv_cache_bytes:
            return super().kv_cache_budget(config, peak_activation_bytes)
        utilization, source = self.utilization(config)
        budget, why = self.device_budget(config, peak_activation_bytes, utilization)
        return budget, f"{why}; utilization from {source}"
