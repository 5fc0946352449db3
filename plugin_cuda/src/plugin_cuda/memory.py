"""GPU memory accounting and KV-cache sizing.

KV bytes = total * utilization - weights - non-torch memory - activation peak -
CUDA-graph reserve, where the utilization is ``GPU_MEMORY_UTILIZATION`` when set, else
the engine's ``gpu_memory_utilization``. Memory other processes hold on the device
counts as non-torch memory, so the plan never takes more than is free. All CUDA
calls go through one object (``torch.cuda`` by default) so tests can fake it; the
profile pass and the utilization come from :class:`plugins.memory.DeviceMemoryProfiler`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from plugins.config import EngineConfigView
from plugins.memory import DeviceMemoryProfiler, GiB

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryBreakdown:
    """What a GPU's memory is spent on before the KV cache (bytes)."""

    total: int
    utilization: float
    weights: int
    non_torch: int
    activations: int
    graphs: int

    @property
    def kv_cache(self) -> int:
        """What is left for the KV cache (0 when the rest does not fit)."""
        return max(
            0, int(self.total * self.utilization) - self.weights - self.non_torch - self.activations - self.graphs
        )

    def describe(self) -> str:
        def gib(n: int) -> str:
            return f"{n / GiB:.2f} GiB"

        text = (
            f"{self.utilization:g} x {gib(self.total)} total - weights {gib(self.weights)} - "
            f"non-torch {gib(self.non_torch)} - activation peak {gib(self.activations)} - "
            f"CUDA graphs {gib(self.graphs)}"
        )
        if self.kv_cache == 0:
            text += (
                " leaves nothing for the KV cache: raise GPU_MEMORY_UTILIZATION or lower max_num_seqs / max_model_len"
            )
        return text


class CudaMemoryProfiler(DeviceMemoryProfiler):
    """Sizes the KV cache from ``torch.cuda`` memory statistics, less the CUDA-graph reserve."""

    torch_module = "cuda"
    utilization_var = "GPU_MEMORY_UTILIZATION"

    def measure_peak(self, profile_fn: Callable[[], None]) -> int:
        peak = super().measure_peak(profile_fn)
        logger.info("cuda: profile forward peaked at %.2f GiB of activations", peak / GiB)
        return peak

    def breakdown(self, config: EngineConfigView, peak_activation_bytes: int, utilization: float) -> MemoryBreakdown:
        """Read the device's memory now and account for everything but the KV cache."""
        free, total = self.device.mem_get_info()
        non_torch = max(0, total - free - self.device.memory_reserved())
        weights = self.weights_bytes if self.weights_bytes is not None else self.device.memory_allocated()
        graphs, graph_why = self.platform.runner.graph_memory_reserve(config, peak_activation_bytes)
        logger.info("cuda: reserving %.2f GiB for CUDA graphs (%s)", graphs / GiB, graph_why)
        return MemoryBreakdown(total, utilization, weights, non_torch, peak_activation_bytes, graphs)

    def device_budget(
        self, config: EngineConfigView, peak_activation_bytes: int, utilization: float
    ) -> tuple[int, str]:
        plan = self.breakdown(config, peak_activation_bytes, utilization)
        return plan.kv_cache, plan.describe()
