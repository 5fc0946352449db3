"""Fixed-shape execution for Neuron: every batch is padded to a compiled shape
(:class:`plugin_neuron.buckets.NeuronShapes`).

Token generation pads the batch to the compiled batch size and the block table to the
token-generation bucket; context encoding runs each whole prompt on its own, right-padded
to its context bucket (padding comes after the prompt, so causal attention keeps it out
of the prompt's own outputs). A prompt continuing a cached prefix runs unpadded.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from plugins.attention import AttentionMetadata
from plugins.config import EngineConfigView
from plugins.runner import ModelInputs, Runner, pad_inputs

from plugin_neuron.buckets import NeuronShapes


def fit_block_tables(meta: AttentionMetadata, width: int) -> AttentionMetadata:
    """The block table at exactly ``width`` columns, the compiled shape: widened with
    block 0 or cut, both only past each sequence's length (``width`` covers the bucket)."""
    table = meta.block_tables[:, :width]
    extra = width - table.shape[1]
    if extra > 0:
        table = torch.cat([table, table.new_zeros(table.shape[0], extra)], dim=1)
    return replace(meta, block_tables=table)


def sequence_inputs(inputs: ModelInputs, index: int) -> ModelInputs:
    """Sequence ``index`` of a batch as a batch of its own."""
    meta = inputs.attn_metadata
    start, end = int(meta.query_start_loc[index]), int(meta.query_start_loc[index + 1])
    one = AttentionMetadata(
        query_start_loc=meta.query_start_loc.new_tensor([0, end - start]),
        seq_lens=meta.seq_lens[index : index + 1],
        block_tables=meta.block_tables[index : index + 1],
        slot_mapping=meta.slot_mapping[start:end],
        query_lens_host=[meta.query_lens_host[index]],
        seq_lens_host=[meta.seq_lens_host[index]],
    )
    return ModelInputs(inputs.input_ids[start:end], inputs.positions[start:end], one)


def pad_prompt(inputs: ModelInputs, length: int, block_size: int) -> ModelInputs:
    """Right-pad one whole prompt to ``length`` tokens: id 0, the next positions, slot -1
    (never written), the block table fitted to ``length``."""
    meta = inputs.attn_metadata
    extra = length - inputs.num_tokens
    if extra < 0:
        raise ValueError(f"cannot pad a {inputs.num_tokens}-token prompt down to {length}")
    ids, positions = inputs.input_ids, inputs.positions
    start = int(positions[-1]) + 1
    padded = replace(
        fit_block_tables(meta, math.ceil(length / block_size)),
        query_start_loc=meta.query_start_loc.new_tensor([0, length]),
        seq_lens=meta.seq_lens.new_tensor([length]),
        slot_mapping=torch.cat([meta.slot_mapping, meta.slot_mapping.new_full((extra,), -1)]),
        query_lens_host=[length],
        seq_lens_host=[length],
    )
    return ModelInputs(
        torch.cat([ids, ids.new_zeros(extra)]),
        torch.cat([positions, torch.arange(start, start + extra).to(positions)]),
        padded,
    )


class NeuronRunner(Runner):
    """Pads every batch to a compiled shape (see the module doc)."""

    def __init__(self, platform: Any) -> None:
        super().__init__(platform)
        self.shapes: NeuronShapes | None = None
        self.block_size = 0

    def prepare(self, model: Any, kv_caches: list[Any], config: EngineConfigView) -> None:
        super().prepare(model, kv_caches, config)
        self.shapes = self.platform.shapes(config)
        self.block_size = config.block_size

    def padded_num_seqs(self, inputs: ModelInputs) -> int | None:
        meta = inputs.attn_metadata
        if self.shapes is None or not meta.is_decode_only or meta.num_seqs > self.shapes.batch_size:
            return None
        return self.shapes.batch_size

    def execute(self, inputs: ModelInputs) -> torch.Tensor:
        """Run ``inputs`` at their compiled shape; hidden states of the real tokens."""
        if self.model is None or self.shapes is None:
            raise RuntimeError("NeuronRunner.execute() called before prepare()")
        meta = inputs.attn_metadata
        if meta.is_decode_only:
            batch, length = self.shapes.token_gen_shape(meta.seq_lens_host)
            padded = pad_inputs(inputs, batch)
            padded = replace(
                padded, attn_metadata=fit_block_tables(padded.attn_metadata, math.ceil(length / self.block_size))
            )
            return self.forward(padded)[: inputs.num_tokens]
        outputs = []
        for index in range(meta.num_seqs):
            one = sequence_inputs(inputs, index)
            query_len = one.num_tokens
            if query_len == meta.seq_lens_host[index]:  # a whole prompt: context encoding at its bucket
                one = pad_prompt(one, self.shapes.context_shape(query_len)[1], self.block_size)
            outputs.append(self.forward(one)[:query_len])
        return torch.cat(outputs)
