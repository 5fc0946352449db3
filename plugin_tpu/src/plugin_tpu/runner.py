"""Padded execution for XLA: decode batches run at a fixed set of sequence counts, so
each count compiles once and is then served from the compiled-graph cache."""

from __future__ import annotations

import logging
from typing import Any

from plugins.config import EngineConfigView
from plugins.runner import ModelInputs, Runner

from plugin_tpu.padding import padded_size, seq_paddings, token_paddings

logger = logging.getLogger(__name__)


class TpuRunner(Runner):
    """Pads decode-only batches to :func:`seq_paddings` sizes; prefills run as they are."""

    def __init__(self, platform: Any) -> None:
        super().__init__(platform)
        self.seq_sizes: list[int] = []
        self.token_sizes: list[int] = []

    def prepare(self, model: Any, kv_caches: list[Any], config: EngineConfigView) -> None:
        super().prepare(model, kv_caches, config)
        self.seq_sizes = seq_paddings(config.max_num_seqs)
        self.token_sizes = token_paddings(
            config.max_num_batched_tokens, padding_gap=self.platform.env["TPU_BUCKET_PADDING_GAP"]
        )
        logger.info(
            "XLA shapes: %d sequence sizes %s, %d token sizes",
            len(self.seq_sizes),
            self.seq_sizes,
            len(self.token_sizes),
        )

    def padded_num_seqs(self, inputs: ModelInputs) -> int | None:
        meta = inputs.attn_metadata
        if not self.seq_sizes or not meta.is_decode_only or meta.num_seqs > self.seq_sizes[-1]:
            return None
        return padded_size(meta.num_seqs, self.seq_sizes)
