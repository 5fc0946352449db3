"""Run a model on a few sequences without the engine: for parity checks, tests and debugging.

It owns a small paged KV cache, gives each sequence consecutive blocks, and builds
the flattened batch (:class:`plugins.attention.AttentionMetadata`) for every step,
exactly as the engine's runner does.
"""

from __future__ import annotations

import torch
from plugins.attention import AttentionMetadata
from plugins.kv_cache import needs_scale, new_kv_scale


class StandaloneRunner:
    """Prefill several prompts in one flattened batch, then decode them step by step."""

    def __init__(
        self,
        model: torch.nn.Module,
        num_seqs: int,
        max_len: int,
        block_size: int = 16,
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        """``kv_cache_dtype``: the caches' dtype (default: the model's; a one-byte one of
        :mod:`plugins.kv_cache` gets each layer's ``kv_scale`` where it needs one)."""
        self.model = model
        self.block_size = block_size
        blocks_per_seq = -(-max_len // block_size)
        self.max_len = blocks_per_seq * block_size
        shape = (num_seqs * blocks_per_seq, block_size, model.num_kv_heads, model.head_size)
        dtype = kv_cache_dtype or model.dtype
        scaled = needs_scale(dtype)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=dtype, device=model.device),
                torch.zeros(shape, dtype=dtype, device=model.device),
                *((new_kv_scale(model.device),) if scaled else ()),
            )
            for _ in range(model.num_layers)
        ]
        # reversed block order, so that a wrong block table shows up as wrong logits
        ids = list(range(num_seqs * blocks_per_seq))[::-1]
        self.block_tables = [ids[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(num_seqs)]
        self.seq_lens = [0] * num_seqs

    @torch.no_grad()
    def step(self, new_tokens: list[list[int]]) -> torch.Tensor:
        """Feed each sequence its next tokens (a prompt, a chunk, or one token); one row per sequence.

        Returns float32 logits ``[num_seqs, vocab]`` of each sequence's last new token.
        """
        if len(new_tokens) != len(self.seq_lens):
            raise ValueError(f"got tokens for {len(new_tokens)} sequences, the runner has {len(self.seq_lens)}")
        query_lens = [len(t) for t in new_tokens]
        positions: list[int] = []
        for i, q_len in enumerate(query_lens):
            positions.extend(range(self.seq_lens[i], self.seq_lens[i] + q_len))
            self.seq_lens[i] += q_len
            if self.seq_lens[i] > self.max_len:
                raise ValueError(f"sequence {i} reached {self.seq_lens[i]} tokens, the runner holds {self.max_len}")
        device = self.model.device
        meta = AttentionMetadata.build(query_lens, self.seq_lens, self.block_tables, self.block_size, device)
        input_ids = torch.tensor([t for seq in new_tokens for t in seq], dtype=torch.int64, device=device)
        hidden = self.model(input_ids, torch.tensor(positions, dtype=torch.int64, device=device), self.kv_caches, meta)
        last_rows = torch.tensor(query_lens, device=device).cumsum(0) - 1
        return self.model.compute_logits(hidden[last_rows])

    def greedy(self, prompts: list[list[int]], num_steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
        """Greedy-decode ``num_steps`` tokens per prompt; returns the tokens and each step's logits."""
        logits = self.step(prompts)
        tokens, all_logits = [[] for _ in prompts], [logits]
        for _ in range(num_steps - 1):
            next_ids = logits.argmax(-1).tolist()
            for seq, tid in zip(tokens, next_ids, strict=True):
                seq.append(tid)
            logits = self.step([[t] for t in next_ids])
            all_logits.append(logits)
        for seq, tid in zip(tokens, logits.argmax(-1).tolist(), strict=True):
            seq.append(tid)
        return tokens, all_logits
