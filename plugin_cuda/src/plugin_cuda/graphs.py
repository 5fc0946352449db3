"""Device-independent parts of CUDA-graph execution: capture sizes and static inputs.

A captured graph replays fixed kernels on fixed memory, so a decode batch is padded
to the next captured batch size (:func:`plugins.runner.pad_inputs` semantics) and
copied into static buffers the graph was captured on. The metadata the graph was
captured with carries worst-case host lists (every sequence ``max_model_len`` long)
so that kernels size their grids for any later batch; real lengths are read from the
device tensors at replay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from plugins.attention import AttentionMetadata
from plugins.buckets import ramp_up_range, smallest_at_least
from plugins.config import EngineConfigView
from plugins.kv_cache import FP8_KV_DTYPES
from plugins.runner import ModelInputs

logger = logging.getLogger(__name__)


def default_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """vLLM's default: 1, 2, 4, then every multiple of 8, up to and including ``max_num_seqs``
    (so that every decode batch the scheduler builds has a graph)."""
    return tuple(ramp_up_range(1, 8, max_num_seqs, end="max"))


def select_capture_sizes(
    config: EngineConfigView, env_sizes: tuple[int, ...] | None, is_graph_safe: bool
) -> tuple[tuple[int, ...], str]:
    """The decode batch sizes to capture and why, e.g. ``((1, 2, 4), "CUDA_GRAPH_SIZES")``.

    Empty when graphs are off: ``config.enforce_eager``, pipeline parallelism, kernels that plan
    on host lengths (``is_graph_safe`` False), an FP8 KV cache, or no size within ``config.max_num_seqs``.
    """
    if config.enforce_eager:
        return (), "enforce_eager is set"
    if config.pipeline_parallel_size > 1:  # graphs are captured on input ids alone
        return (), "pipeline parallel: a stage after the first takes the previous stage's hidden states"
    if not is_graph_safe:
        return (), "the attention kernels are not graph-safe (CUDA_ATTENTION_BACKEND=reference)"
    if config.kv_cache_dtype in FP8_KV_DTYPES:  # the reference write indexes by a mask: a host sync
        return (), f"kv_cache_dtype {config.kv_cache_dtype} runs the torch reference kernels (not graph-safe)"
    max_num_seqs = config.max_num_seqs
    if env_sizes is None:
        return default_capture_sizes(max_num_seqs), f"default sizes up to max_num_seqs={max_num_seqs}"
    kept = tuple(s for s in sorted(set(env_sizes)) if s <= max_num_seqs)
    dropped = sorted(set(env_sizes) - set(kept))
    if dropped:
        logger.info("cuda graphs: sizes %s exceed max_num_seqs=%d and are not captured", dropped, max_num_seqs)
    if not kept:
        return (), f"no CUDA_GRAPH_SIZES entry is <= max_num_seqs={max_num_seqs}"
    return kept, "CUDA_GRAPH_SIZES"


def padded_size(sizes: tuple[int, ...], num_seqs: int) -> int | None:
    """The smallest captured size that holds ``num_seqs`` (sorted ``sizes``), or None."""
    return smallest_at_least(num_seqs, sizes)


@dataclass
class StaticInputs:
    """The buffers every captured graph reads; batch size ``n`` uses the first ``n`` rows."""

    input_ids: torch.Tensor  # int64 [max_num_seqs]
    positions: torch.Tensor  # int64 [max_num_seqs]
    query_start_loc: torch.Tensor  # int32 [max_num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [max_num_seqs]
    block_tables: torch.Tensor  # int32 [max_num_seqs, max_blocks_per_seq]
    slot_mapping: torch.Tensor  # int64 [max_num_seqs]

    @classmethod
    def allocate(cls, max_num_seqs: int, max_blocks_per_seq: int, device: torch.device | str) -> StaticInputs:
        """Buffers holding padding (id 0, seq_len 0, slot -1): a warm-up or capture run
        over them writes no KV slot and reads no cache block."""
        return cls(
            input_ids=torch.zeros(max_num_seqs, dtype=torch.int64, device=device),
            positions=torch.zeros(max_num_seqs, dtype=torch.int64, device=device),
            query_start_loc=torch.arange(max_num_seqs + 1, dtype=torch.int32, device=device),
            seq_lens=torch.zeros(max_num_seqs, dtype=torch.int32, device=device),
            block_tables=torch.zeros(max_num_seqs, max_blocks_per_seq, dtype=torch.int32, device=device),
            slot_mapping=torch.full((max_num_seqs,), -1, dtype=torch.int64, device=device),
        )

    @property
    def max_num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def max_blocks_per_seq(self) -> int:
        return int(self.block_tables.shape[1])

    def inputs(self, num_seqs: int, max_seq_len: int) -> ModelInputs:
        """Views of the first ``num_seqs`` rows, with worst-case host lengths ``max_seq_len``."""
        meta = AttentionMetadata(
            query_start_loc=self.query_start_loc[: num_seqs + 1],
            seq_lens=self.seq_lens[:num_seqs],
            block_tables=self.block_tables[:num_seqs],
            slot_mapping=self.slot_mapping[:num_seqs],
            query_lens_host=[1] * num_seqs,
            seq_lens_host=[max_seq_len] * num_seqs,
        )
        return ModelInputs(self.input_ids[:num_seqs], self.positions[:num_seqs], meta)

    def fits(self, inputs: ModelInputs) -> bool:
        """Whether a (padded) decode batch fits these buffers."""
        meta = inputs.attn_metadata
        return meta.num_seqs <= self.max_num_seqs and meta.block_tables.shape[1] <= self.max_blocks_per_seq

    def load(self, padded: ModelInputs) -> None:
        """Copy a padded decode batch of ``n`` sequences into the first ``n`` rows."""
        if not self.fits(padded):
            raise ValueError(
                f"batch of {padded.attn_metadata.num_seqs} sequences x {padded.attn_metadata.block_tables.shape[1]} "
                f"blocks does not fit static buffers of {self.max_num_seqs} x {self.max_blocks_per_seq}"
            )
        meta = padded.attn_metadata
        n, width = meta.num_seqs, meta.block_tables.shape[1]
        self.input_ids[:n].copy_(padded.input_ids, non_blocking=True)
        self.positions[:n].copy_(padded.positions, non_blocking=True)
        self.query_start_loc[: n + 1].copy_(meta.query_start_loc, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        # columns past `width` keep stale block ids: never read, since a sequence's
        # seq_len covers at most `width` blocks
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
