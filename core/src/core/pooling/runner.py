"""One pooling step on the device: a batch of whole sequences in, their last hidden states out.

:class:`EncoderRunner` runs an encoder (BERT) as it is: no KV cache, attention through
``kernels.encoder_attention``. :class:`DecoderRunner` runs a causal decoder as an embedding
model on the platform's own runner over a scratch KV cache that holds one step: every step
writes its sequences from block 0 again, so nothing is kept between steps.
"""

from __future__ import annotations

import torch
from plugins import EngineConfigView, Platform
from plugins.attention import AttentionMetadata
from plugins.runner import ModelInputs

from core.model_runner import ModelRunner


class EncoderRunner:
    """Runs an encoder model on ``platform``'s device."""

    def __init__(self, platform: Platform, model: torch.nn.Module) -> None:
        self.platform = platform
        self.model = model
        self.device = platform.runner.io_device()

    def hidden_states(self, sequences: list[list[int]], token_types: list[list[int]]) -> torch.Tensor:
        """``[T, hidden_size]``: the sequences' last hidden states, concatenated (``token_types``:
        each token's segment, 1 for a pair's second text)."""
        lens = [len(s) for s in sequences]
        ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long, device=self.device)
        types = torch.tensor([t for s in token_types for t in s], dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        starts = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=self.device)
        with self.platform.runner.grad_mode():
            return self.model(ids, positions, types, starts, lens)


class DecoderRunner:
    """Runs a causal decoder (``--runner pooling``) through ``runner``'s model and KV cache.

    :param max_step_tokens: the most tokens one step holds (the scratch cache's size).
    """

    def __init__(self, platform: Platform, runner: ModelRunner, config: EngineConfigView, max_step_tokens: int) -> None:
        self.platform = platform
        self.block_size = config.block_size
        num_blocks = -(-max_step_tokens // self.block_size) + config.max_num_seqs  # each sequence's last block partial
        runner.allocate_and_prepare(num_blocks)
        self.device = platform.runner.io_device()

    def hidden_states(self, sequences: list[list[int]], token_types: list[list[int]]) -> torch.Tensor:
        """``[T, hidden_size]``: the final (normed) hidden states of the sequences, concatenated
        (a decoder has no segments: ``token_types`` are all 0 and unused)."""
        lens = [len(s) for s in sequences]
        tables, next_block = [], 0
        for n in lens:
            num = -(-n // self.block_size)
            tables.append(list(range(next_block, next_block + num)))
            next_block += num
        meta = AttentionMetadata.build(lens, lens, tables, self.block_size, device=self.device)
        ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        runner = self.platform.runner
        with runner.grad_mode():
            return runner.execute(ModelInputs(ids, positions, meta))
