"""CUDA-graph execution: decode batches replay graphs captured per batch size.

Decode batches up to the largest captured size are padded to the next captured size
and replayed; prefill, mixed and larger batches run eagerly. All CUDA calls go
through :class:`TorchCudaGraphs` so the bookkeeping can be tested off-GPU with a
stand-in that re-runs the captured function.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from plugins.config import EngineConfigView
from plugins.memory import MiB
from plugins.runner import ModelInputs, Runner

from plugin_cuda.graphs import StaticInputs, padded_size, select_capture_sizes

logger = logging.getLogger(__name__)


#: memory one captured graph is assumed to take beyond its activations (graph exec
#: objects, per-graph buffers); ~67 sizes then reserve ~0.5 GiB, vLLM's usual figure
GRAPH_OVERHEAD_BYTES = 8 * MiB
#: memory of the capture's side stream whatever the sizes: its cuBLAS/cuBLASLt workspaces
#: (32 MiB each on Hopper). Measured on an H100: 11 graphs of a Qwen2-0.5B-shaped model took
#: 138 MiB (4 MiB of activations), 4 graphs of a tiny model 106 MiB (the process's first capture)
CAPTURE_STREAM_BYTES = 80 * MiB


class TorchCudaGraphs:
    """The CUDA calls of graph capture and replay (replaced by a stand-in in CPU tests).

    Warm-up and capture share one side stream: cuBLAS keeps a workspace per stream
    (32 MiB on Hopper), and a new stream per warm-up cost one more for every size.
    """

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def _side_stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def warm_up(self, fn: Callable[[], torch.Tensor]) -> None:
        """Run ``fn`` once outside capture (compiles kernels, creates library workspaces),
        on the capture's side stream as torch recommends before capturing."""
        side = self._side_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any) -> tuple[Any, torch.Tensor]:
        """Capture ``fn`` into a new graph on ``pool``; return ``(graph, its output)``."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=self._side_stream()):
            out = fn()
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.replay()

    def free_memory(self) -> int:
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0]


class CudaGraphRunner(Runner):
    """Replays CUDA graphs for decode batches; eager for everything else."""

    def __init__(self, platform: Any, graphs: TorchCudaGraphs | None = None) -> None:
        super().__init__(platform)
        self.graph_api = graphs or TorchCudaGraphs()
        self.capture_sizes: tuple[int, ...] = ()
        self.graph_memory_bytes: int | None = None  # measured by prepare()
        self.graph_reserve_bytes: int | None = None  # reserved before the KV cache was sized
        self._graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        self._static: StaticInputs | None = None

    def _sizes(self, config: EngineConfigView) -> tuple[tuple[int, ...], str]:
        kernels = self.platform.kernels
        return select_capture_sizes(
            config, self.platform.env["CUDA_GRAPH_SIZES"], getattr(kernels, "is_graph_safe", False)
        )

    def graph_memory_reserve(self, config: EngineConfigView, peak_activation_bytes: int) -> tuple[int, str]:
        """Bytes to keep free for the graphs :meth:`prepare` will capture, and how estimated.

        Called by the memory profiler before the KV cache is sized, when no graph exists
        yet: a decode batch of ``B`` tokens needs about ``B / profile_tokens`` of the
        profile forward's activations (graphs share one pool, so the largest size
        counts), plus :data:`GRAPH_OVERHEAD_BYTES` per graph and :data:`CAPTURE_STREAM_BYTES`.
        """
        sizes, why = self._sizes(config)
        if not sizes:
            return 0, f"no CUDA graphs ({why})"
        profile_tokens = max(1, min(config.max_num_batched_tokens, config.max_num_seqs * config.max_model_len))
        activations = -(-peak_activation_bytes * min(sizes[-1], profile_tokens) // profile_tokens)
        overhead = len(sizes) * GRAPH_OVERHEAD_BYTES + CAPTURE_STREAM_BYTES
        self.graph_reserve_bytes = activations + overhead
        return self.graph_reserve_bytes, (
            f"{len(sizes)} graphs up to batch {sizes[-1]}: {activations / MiB:.0f} MiB activations + "
            f"{overhead / MiB:.0f} MiB overhead"
        )

    def prepare(self, model: torch.nn.Module, kv_caches: list[Any], config: EngineConfigView) -> None:
        """Bind ``model`` and ``kv_caches``; capture one graph per capture size on static buffers over them."""
        super().prepare(model, kv_caches, config)
        self._graphs.clear()
        self.capture_sizes, why = self._sizes(config)
        if not self.capture_sizes:
            logger.info("cuda graphs off: %s; every batch runs eagerly", why)
            return
        device = kv_caches[0][0].device
        max_blocks = -(-config.max_model_len // config.block_size)
        self._static = StaticInputs.allocate(self.capture_sizes[-1], max_blocks, device)
        free_before = self.graph_api.free_memory()
        started = time.perf_counter()
        pool = self.graph_api.new_pool()
        with torch.inference_mode():
            for size in reversed(self.capture_sizes):  # largest first: smaller ones reuse its pool
                inputs = self._static.inputs(size, config.max_model_len)

                def run(inputs: ModelInputs = inputs) -> torch.Tensor:
                    return model(inputs.input_ids, inputs.positions, kv_caches, inputs.attn_metadata)

                self.graph_api.warm_up(run)  # static buffers hold padding: no KV slot is written
                self._graphs[size] = self.graph_api.capture(run, pool)
        self.graph_memory_bytes = max(0, free_before - self.graph_api.free_memory())
        logger.info(
            "cuda graphs: captured %d sizes (%s; %s) in %.1f s, %.0f MiB",
            len(self.capture_sizes), _short(self.capture_sizes), why,
            time.perf_counter() - started, self.graph_memory_bytes / MiB,
        )  # fmt: skip
        if self.graph_reserve_bytes is not None and self.graph_memory_bytes > self.graph_reserve_bytes:
            logger.warning(
                "cuda graphs took %.0f MiB, more than the %.0f MiB reserved before sizing the KV cache; "
                "lower GPU_MEMORY_UTILIZATION if the GPU runs out of memory",
                self.graph_memory_bytes / MiB, self.graph_reserve_bytes / MiB,
            )  # fmt: skip

    def stage(self, host: torch.Tensor) -> torch.Tensor:
        """One asynchronous copy from pinned memory: the host goes on building the next step.
        The caching host allocator keeps the pinned block until the copy has run."""
        device = self.io_device()
        if device.type == "cpu":  # the runner's CPU tests
            return host
        return host.pin_memory().to(device, non_blocking=True)

    def padded_num_seqs(self, inputs: ModelInputs) -> int | None:
        """The captured size a decode batch is padded to, or None to run it eagerly."""
        meta = inputs.attn_metadata
        # the graphs were captured without LoRA deltas: a step with adapter rows runs eagerly
        if not self._graphs or not meta.num_seqs or not meta.is_decode_only or inputs.lora is not None:
            return None
        size = padded_size(self.capture_sizes, meta.num_seqs)
        if size is None or meta.block_tables.shape[1] > self._static.max_blocks_per_seq:
            return None
        return size

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        """Replay the graph of this (already padded) batch size, or run eagerly."""
        num_seqs = inputs.attn_metadata.num_seqs
        if self.padded_num_seqs(inputs) != num_seqs:
            return super().forward(inputs)
        graph, out = self._graphs[num_seqs]
        self._static.load(inputs)
        self.graph_api.replay(graph)
        # the graph's output memory is overwritten by the next replay
        return out.clone()


def _short(sizes: tuple[int, ...]) -> str:
    return ",".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]},{sizes[1]},...,{sizes[-1]}"
