"""Bucketed execution for Gaudi: pad each batch to its bucket, warm every bucket up
before serving, and replay HPU graphs on the device."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import torch
from plugins.attention import AttentionMetadata
from plugins.config import EngineConfigView
from plugins.runner import ModelInputs, Runner, pad_inputs

from plugin_hpu.bucketing import Bucket, HpuBuckets, blocks_of, warmup_order

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


class HpuRunner(Runner):
    """Pads decode batches to (batch size, blocks) buckets; prompts run at their shape.

    ``prepare`` builds the buckets from the engine config and the bucket variables,
    warms every bucket up (unless ``SKIP_WARMUP``) and, on a Gaudi device without
    ``enforce_eager``, wraps the model with ``wrap_in_hpu_graph`` so each bucket's
    graph is captured once and replayed.
    """

    def __init__(self, platform: Any) -> None:
        super().__init__(platform)
        self.buckets: HpuBuckets | None = None
        self.block_size = 0
        self._graph_model: Any = None

    def prepare(self, model: torch.nn.Module, kv_caches: list[Any], config: EngineConfigView) -> None:
        super().prepare(model, kv_caches, config)
        self._graph_model = None
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
        if device.type == "hpu" and not config.enforce_eager:
            from habana_frameworks.torch.hpu import wrap_in_hpu_graph

            self._graph_model = wrap_in_hpu_graph(model)
            logger.info("HPU graphs enabled: one graph per bucket, captured on first use")
        if env["SKIP_WARMUP"]:
            logger.warning("SKIP_WARMUP set: the first batch of each bucket will compile a graph")
            return
        self.warmup(device)

    def warmup(self, device: Any) -> int:
        """Run every bucket once with dummy inputs, largest first; return the count."""
        jobs = [(b, True) for b in warmup_order(self.buckets.prompt)]
        jobs += [(b, False) for b in warmup_order(self.buckets.decode)]
        for index, (bucket, is_prompt) in enumerate(jobs, 1):
            phase = "Prompt" if is_prompt else "Decode"
            logger.debug("[Warmup][%s][%d/%d] batch_size:%d %s:%d", phase, index, len(jobs), bucket[0],
                         "seq_len" if is_prompt else "blocks", bucket[1])  # fmt: skip
            self.forward(dummy_inputs(bucket, is_prompt, self.block_size, device))
        self.platform.synchronize()
        return len(jobs)

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
        needs more); prompts and batches over every bucket run at their own shape."""
        if self.model is None:
            raise RuntimeError("HpuRunner.execute() called before prepare()")
        num_tokens = inputs.num_tokens
        bucket = self.decode_bucket(inputs)
        if bucket is not None:
            inputs = pad_block_tables(pad_inputs(inputs, bucket[0]), math.ceil(bucket[1] / bucket[0]))
        return self.forward(inputs)[:num_tokens]

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        runnable = self._graph_model if self._graph_model is not None else self.model
        return runnable(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn_metadata)
