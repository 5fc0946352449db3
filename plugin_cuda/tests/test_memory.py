"""KV-cache planning with fake GPU memory numbers (the CUDA calls are faked)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from plugin_cuda.memory import CudaMemoryProfiler, MemoryBreakdown
from plugin_cuda.platform import CudaPlatform
from plugin_cuda.runner import CAPTURE_STREAM_BYTES, GRAPH_OVERHEAD_BYTES, CudaGraphRunner
from plugins.reference import engine_config as reference_engine_config

GiB = 1 << 30
MiB = 1 << 20


class FakeCuda:
    """The torch.cuda memory calls the profiler makes, over made-up numbers."""

    def __init__(self, total: int, weights: int, non_torch: int) -> None:
        self.total, self.allocated, self.non_torch = total, weights, non_torch
        self.reserved = weights
        self.peak = weights
        self.calls: list[str] = []

    def mem_get_info(self) -> tuple[int, int]:
        return self.total - self.reserved - self.non_torch, self.total

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def reset_peak_memory_stats(self) -> None:
        self.calls.append("reset")
        self.peak = self.allocated

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.peak

    def memory_reserved(self) -> int:
        return self.reserved

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")
        self.reserved = self.allocated

    def run_forward(self, activations: int) -> None:
        """What a profile forward does to the allocator: a temporary peak."""
        self.peak = max(self.peak, self.allocated + activations)
        self.reserved = max(self.reserved, self.allocated + activations)


class FakePlatform(CudaPlatform):
    """The cuda platform's config and runner, without a GPU."""

    @property
    def kernels(self):
        return SimpleNamespace(is_graph_safe=True)


def engine_config(**kw):
    return reference_engine_config(**{"max_num_seqs": 64, "max_num_batched_tokens": 2048, "max_model_len": 4096, **kw})


@pytest.fixture
def setup(monkeypatch):
    for name in (
        "CORE_GPU_MEMORY_UTILIZATION",
        "VLLM_GPU_MEMORY_UTILIZATION",
        "CORE_CUDA_GRAPH_SIZES",
        "VLLM_CUDA_GRAPH_SIZES",
    ):
        monkeypatch.delenv(name, raising=False)
    plat = FakePlatform()
    plat.runner = CudaGraphRunner(plat, graphs=object())
    cuda = FakeCuda(total=80 * GiB, weights=16 * GiB, non_torch=1 * GiB)
    return plat, cuda, CudaMemoryProfiler(plat, cuda)


def test_measure_peak_counts_activations_only(setup) -> None:
    _, cuda, prof = setup
    peak = prof.measure_peak(lambda: cuda.run_forward(3 * GiB))
    assert peak == 3 * GiB
    assert prof.weights_bytes == 16 * GiB
    assert cuda.calls[:2] == ["synchronize", "reset"] and cuda.calls[-1] == "empty_cache"
    assert prof.total_memory() == 80 * GiB and prof.free_memory() == 63 * GiB


def test_kv_budget_is_utilization_minus_everything_else(setup) -> None:
    plat, cuda, prof = setup
    cfg = engine_config()
    peak = prof.measure_peak(lambda: cuda.run_forward(2 * GiB))
    graphs, why = plat.runner.graph_memory_reserve(cfg, peak)
    # 11 sizes up to 64: the largest is 64/2048 of the profile's activations, + per-graph and stream overhead
    assert (
        graphs == 2 * GiB * 64 // 2048 + 11 * GRAPH_OVERHEAD_BYTES + CAPTURE_STREAM_BYTES
        and "11 graphs up to batch 64" in why
    )
    budget, detail = prof.kv_cache_budget(cfg, peak)
    assert budget == int(80 * GiB * 0.9) - 16 * GiB - 1 * GiB - 2 * GiB - graphs
    assert "weights 16.00 GiB" in detail and "non-torch 1.00 GiB" in detail and "from gpu_memory_utilization" in detail
    plan = prof.plan_kv_cache(cfg, block_bytes=2 * MiB, peak_activation_bytes=peak)
    assert plan.num_blocks == budget // (2 * MiB)


def test_env_utilization_overrides_config(setup, monkeypatch) -> None:
    _, _, prof = setup
    monkeypatch.setenv("VLLM_GPU_MEMORY_UTILIZATION", "0.5")
    assert prof.utilization(engine_config(gpu_memory_utilization=0.8)) == (0.5, "VLLM_GPU_MEMORY_UTILIZATION")
    monkeypatch.delenv("VLLM_GPU_MEMORY_UTILIZATION")
    assert prof.utilization(engine_config(gpu_memory_utilization=0.8)) == (0.8, "gpu_memory_utilization")


def test_eager_reserves_nothing_for_graphs(setup) -> None:
    plat, _, _ = setup
    assert plat.runner.graph_memory_reserve(engine_config(enforce_eager=True), GiB) == (
        0,
        "no CUDA graphs (enforce_eager is set)",
    )


def test_requested_kv_bytes_win(setup) -> None:
    _, _, prof = setup
    assert prof.kv_cache_budget(engine_config(kv_cache_bytes=5 * GiB), 0) == (5 * GiB, "5.00 GiB requested")


def test_not_enough_memory_gives_zero_and_says_what_to_do() -> None:
    plan = MemoryBreakdown(total=24 * GiB, utilization=0.5, weights=14 * GiB, non_torch=GiB, activations=GiB, graphs=0)
    assert plan.kv_cache == 0
    assert "raise GPU_MEMORY_UTILIZATION" in plan.describe()
