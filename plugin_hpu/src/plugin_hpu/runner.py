"""Bucketed execution for Gaudi: pad each batch to its bucket, warm every bucket up
before serving, then capture HPU graphs for the buckets the graph memory holds
(:func:`plugin_hpu.graph_memory.capture_graphs`, in each phase's strategy order) and
replay them; the other buckets run without a graph."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from plugins.attention import AttentionMetadata
from plugins.config import EngineConfigView
from plugins.runner import ModelInputs, Runner, pad_inputs

from plugin_hpu.bucketing import Bucket, HpuBuckets, blocks_of, capture_order, warmup_order
from plugin_hpu.graph_memory import CaptureResult, capture_graphs, describe_split, split_graph_memory

logger = logging.getLogger(__name__)


def pad_block_tables(inputs: ModelInputs, width: int) -> ModelInputs:
    """Widen the block table to ``width`` columns with block 0 (never read: it lies
    past every sequence's length), so that the shape depends only on the bucket."""
    meta = inputs.attn_metadata
    extra = width - meta.block_tables.shape[1]
    if extra <= 0:
        return inputs
    pad = meta.block_tables.new_zeros(meta.block_tables.shape[0], extra)
    return replace(inputs, attn_metadata=replace(meta, block_tables=torch.cat([meta.block_tables, pad], dim=1)))


def dummy_inputs(bucket: Bucket, is_prompt: bool, block_size: int, device: Any) -> ModelInputs:
    """Inputs of a bucket's shape for warm-up: every slot is -1, so no cache is written."""
    num_seqs, second = bucket
    if is_prompt:
        lens, width = [second] * num_seqs, math.ceil(second / block_size)
    else:
        lens, width = [1] * num_seqs, math.ceil(second / num_seqs)
    meta = AttentionMetadata.build(
        lens if is_prompt else [1] * num_seqs, lens, [[0] * width] * num_seqs, block_size, device
    )
    meta.slot_mapping.fill_(-1)
    num_tokens = meta.num_tokens
    zeros = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    return ModelInputs(zeros, zeros.clone(), meta)


def hpu_graph_wrapper(model: Any) -> Any:
    """The device path: a callable that runs ``model`` through HPU graphs, one per input
    shape, captured on its first call (habana_frameworks, imported here only).

    ``wrap_in_hpu_graph`` replaces the ``forward`` of the module it is given, so it gets
    a thin module of its own and ``model`` itself stays eager for ungraphed buckets.
    """
    from habana_frameworks.torch.hpu import wrap_in_hpu_graph

    class GraphedForward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            return self.model(*args)

    return wrap_in_hpu_graph(GraphedForward(), disable_tensor_cache=True)


def prompt_shape(inputs: ModelInputs) -> tuple[Bucket, bool] | None:
    """``((batch size, sequence length), True)`` of a prompt batch that has a bucket's
    shape (whole prompts of one length), or None: prompts are not padded, so only such a
    batch can replay a prompt graph."""
    meta = inputs.attn_metadata
    length = meta.max_seq_len
    if meta.is_decode_only or any(q != length for q in meta.query_lens_host + meta.seq_lens_host):
        return None
    return (meta.num_seqs, length), True


class HpuRunner(Runner):
    """Pads decode batches to (batch size, blocks) buckets; prompts run at their shape.

    ``prepare`` builds the buckets from the engine config and the bucket variables and
    warms every bucket up (unless ``SKIP_WARMUP``). With graphs (a Gaudi device, or a
    ``graph_wrapper`` given, and no ``enforce_eager``) it then captures the graphs that
    fit the graph memory: what is free after warm-up above the memory profiler's margin,
    ``GRAPH_PROMPT_RATIO`` of it for prompts, each phase in its ``GRAPH_*_STRATEGY``
    order. Only those buckets replay a graph; with ``SKIP_WARMUP`` every bucket is
    graphed on first use, without a budget, as vLLM does.

    :param graph_wrapper: turns the model into its graph-replaying callable (default:
        :func:`hpu_graph_wrapper` on an ``hpu`` device, none elsewhere).
    """

    def __init__(self, platform: Any, graph_wrapper: Callable[[Any], Any] | None = None) -> None:
        super().__init__(platform)
        self.graph_wrapper = graph_wrapper
        self.buckets: HpuBuckets | None = None
        self.block_size = 0
        self._graph_model: Any = None
        #: ``(bucket, is_prompt)`` pairs that replay a graph (see :meth:`uses_graph`)
        self.graphed: set[tuple[Bucket, bool]] = set()
        self.graph_every_bucket = False
        self.captured: tuple[CaptureResult, CaptureResult] | None = None

    def prepare(self, model: torch.nn.Module, kv_caches: list[Any], config: EngineConfigView) -> None:
        super().prepare(model, kv_caches, config)
        env = self.platform.env
        self.block_size = config.block_size
        num_blocks = kv_caches[0][0].shape[0] if kv_caches else None
        self.buckets = HpuBuckets.build(
            env,
            max_num_seqs=config.max_num_seqs,
            block_size=config.block_size,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_blocks=num_blocks,
        )
        logger.info("HPU %s", self.buckets.describe())
        device = kv_caches[0][0].device if kv_caches else torch.device("cpu")
        wrapper = self.graph_wrapper or (hpu_graph_wrapper if device.type == "hpu" else None)
        self._graph_model = None if config.enforce_eager or wrapper is None else wrapper(model)
        self.graphed, self.graph_every_bucket, self.captured = set(), False, None
        if env["SKIP_WARMUP"]:
            self.graph_every_bucket = self._graph_model is not None
            logger.warning("SKIP_WARMUP set: the first batch of each bucket compiles (and graphs) it, unbudgeted")
            return
        self.warmup(device)
        if self._graph_model is not None:
            self.capture(device, config)

    def warmup(self, device: Any) -> int:
        """Run every bucket once with dummy inputs, largest first, without graphs; return the count."""
        jobs = [(b, True) for b in warmup_order(self.buckets.prompt)]
        jobs += [(b, False) for b in warmup_order(self.buckets.decode)]
        for index, (bucket, is_prompt) in enumerate(jobs, 1):
            phase = "Prompt" if is_prompt else "Decode"
            logger.debug("[Warmup][%s][%d/%d] batch_size:%d %s:%d", phase, index, len(jobs), bucket[0],
                         "seq_len" if is_prompt else "blocks", bucket[1])  # fmt: skip
            self.forward(dummy_inputs(bucket, is_prompt, self.block_size, device))
        self.platform.synchronize()
        return len(jobs)

    def capture(self, device: Any, config: EngineConfigView) -> tuple[CaptureResult, CaptureResult]:
        """Capture the graphs the graph memory holds (see the class doc); return both phases' results.

        Each capture is measured as the drop of the device's free memory across it.
        """
        env, memory = self.platform.env, self.platform.memory
        plan = memory.plan  # the HpuMemoryProfiler's split of the KV planning
        free_now = memory.free_memory()
        # the profiler's margin (free * (1 - utilization)) stays free; without its plan
        # (the user sized the KV cache), the same share of what is free now
        margin = plan.margin_bytes if plan is not None else int(free_now * (1 - config.gpu_memory_utilization))
        ratio = env["GRAPH_PROMPT_RATIO"]
        total, prompt_bytes, decode_bytes = split_graph_memory(free_now, margin, ratio)
        logger.info("%s", describe_split(total, free_now, prompt_bytes, decode_bytes, ratio))

        def capture_one(bucket: Bucket, is_prompt: bool) -> int:
            before = memory.free_memory()
            self.graphed.add((bucket, is_prompt))
            self.forward(dummy_inputs(bucket, is_prompt, self.block_size, device), (bucket, is_prompt))
            self.platform.synchronize()
            return max(0, before - memory.free_memory())

        self.captured = capture_graphs(
            capture_order(self.buckets.prompt, env["GRAPH_PROMPT_STRATEGY"]),
            capture_order(self.buckets.decode, env["GRAPH_DECODE_STRATEGY"]),
            total,
            ratio,
            capture_one,
        )
        prompt, decode = self.captured
        logger.info("%s", prompt.describe("Prompt", len(self.buckets.prompt)))
        logger.info("%s", decode.describe("Decode", len(self.buckets.decode)))
        return self.captured

    def uses_graph(self, bucket: Bucket | None, is_prompt: bool) -> bool:
        """Whether a batch of ``bucket`` replays a graph (never for a batch over every bucket)."""
        if self._graph_model is None or bucket is None:
            return False
        return self.graph_every_bucket or (bucket, is_prompt) in self.graphed

    def decode_bucket(self, inputs: ModelInputs) -> Bucket | None:
        """The decode bucket of a decode-only batch, or None (prompt, or over every bucket)."""
        meta = inputs.attn_metadata
        if self.buckets is None or not meta.is_decode_only:
            return None
        return self.buckets.decode_bucket(meta.num_seqs, blocks_of(meta.seq_lens_host, self.block_size))

    def padded_num_seqs(self, inputs: ModelInputs) -> int | None:
        bucket = self.decode_bucket(inputs)
        return bucket[0] if bucket else None

    def execute(self, inputs: ModelInputs) -> torch.Tensor:
        """Pad a decode batch to its bucket: sequences to the bucket's batch size, the
        block table to ``blocks / batch size`` columns (wider when one sequence alone
        needs more); prompts and batches over every bucket run at their own shape. A
        batch whose (padded) shape is a graphed bucket replays its graph."""
        if self.model is None:
            raise RuntimeError("HpuRunner.execute() called before prepare()")
        num_tokens = inputs.num_tokens
        bucket = self.decode_bucket(inputs)
        if bucket is not None:
            inputs = pad_block_tables(pad_inputs(inputs, bucket[0]), math.ceil(bucket[1] / bucket[0]))
            return self.forward(inputs, (bucket, False))[:num_tokens]
        return self.forward(inputs, prompt_shape(inputs))[:num_tokens]

    def forward(self, inputs: ModelInputs, key: tuple[Bucket, bool] | None = None) -> torch.Tensor:
        """Run ``inputs``: through the graph when ``key`` (bucket, is_prompt) is graphed, else eagerly."""
        # graphs hold no LoRA deltas: a step with adapter rows runs eagerly
        graphed = key is not None and inputs.lora is None and self.uses_graph(*key)
        runnable = self._graph_model if graphed else self.model
        return runnable(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn_metadata)
