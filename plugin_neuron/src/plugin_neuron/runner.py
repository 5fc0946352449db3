"""Fixed-batch execution for Neuron: graphs are compiled for one batch size."""

from __future__ import annotations

from typing import Any

from plugins.config import EngineConfigView
from plugins.runner import ModelInputs, Runner


class NeuronRunner(Runner):
    """Decode batches run at the compiled batch size ``max_num_seqs``."""

    def __init__(self, platform: Any) -> None:
        super().__init__(platform)
        self.batch_size: int | None = None

    def prepare(self, model: Any, kv_caches: list[Any], config: EngineConfigView) -> None:
        super().prepare(model, kv_caches, config)
        self.batch_size = config.max_num_seqs

    def padded_num_seqs(self, inputs: ModelInputs) -> int | None:
        meta = inputs.attn_metadata
        if self.batch_size is None or not meta.is_decode_only or meta.num_seqs > self.batch_size:
            return None
        return self.batch_size
