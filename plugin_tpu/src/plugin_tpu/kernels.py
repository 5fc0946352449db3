"""Attention and KV writes as static-shape tensor ops that XLA compiles.

The SDK's reference kernels loop over sequences with host-side lengths, so every
new mix of lengths would trace a new graph. These take their per-token layout from
:class:`XlaAttentionMetadata` (built by :class:`plugin_tpu.runner.TpuRunner` on the
host at the padded sizes): the shapes depend only on the padded token count and the
fixed block-table width, never on the lengths inside the batch.

On a real TPU ``use_pallas`` hands attention to torch_xla's Pallas kernel (it does
not run on XLA:CPU, where the pure-torch version here is what runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from plugins.attention import AttentionMetadata
from plugins.errors import UnsupportedFeature
from plugins.kernels import Kernels


@dataclass
class XlaAttentionMetadata(AttentionMetadata):
    """:class:`AttentionMetadata` plus the per-token view the XLA kernels read.

    ``token_tables[t]`` is the block table of token ``t``'s sequence, padded to a
    fixed width (the blocks of ``max_model_len``); ``context_lens[t]`` is how many
    keys token ``t`` sees (its position + 1). Padding tokens see one key of block 0
    and have slot -1: their rows are computed and cut off, never written.
    """

    token_tables: torch.Tensor | None = None  # int32 [T, max_blocks_per_seq]
    context_lens: torch.Tensor | None = None  # int32 [T]


def token_layout(meta: AttentionMetadata, num_tokens: int, table_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_tables, context_lens)`` of :class:`XlaAttentionMetadata`, on the host, for
    ``meta``'s tokens followed by padding tokens up to ``num_tokens``.

    A token's position comes from the host lengths: the ``i``-th of a sequence's
    ``query_len`` new tokens is at ``seq_len - query_len + i``. Every token sees at
    least one key, so rows of padding sequences (``seq_len`` 0) stay finite.
    """
    tables = torch.zeros(meta.num_seqs, table_width, dtype=torch.int32)
    width = min(meta.block_tables.shape[1], table_width)
    tables[:, :width] = meta.block_tables.cpu()[:, :width]
    query_lens = torch.tensor(meta.query_lens_host, dtype=torch.int64)
    seq_of_token = torch.repeat_interleave(torch.arange(meta.num_seqs), query_lens)
    starts = torch.cumsum(query_lens, 0) - query_lens
    seq_lens = torch.tensor(meta.seq_lens_host, dtype=torch.int64)
    index_in_seq = torch.arange(seq_of_token.shape[0]) - starts[seq_of_token]
    positions = (seq_lens - query_lens)[seq_of_token] + index_in_seq
    real = seq_of_token.shape[0]
    token_tables = torch.zeros(num_tokens, table_width, dtype=torch.int32)
    token_tables[:real] = tables[seq_of_token]
    context_lens = torch.ones(num_tokens, dtype=torch.int32)
    context_lens[:real] = (positions + 1).clamp(min=1).to(torch.int32)
    return token_tables, context_lens


def _refuse_scale(kv_scale: torch.Tensor | None) -> None:
    if kv_scale is not None:
        raise UnsupportedFeature(
            "the tpu kernels keep K/V in the compute dtype (supported_kv_cache_dtypes is empty): "
            "no kv_scale of an E4M3 cache"
        )


class XlaKernels(Kernels):
    """The reference kernels, with attention and KV writes that trace to one graph per shape."""

    def __init__(self, use_pallas: bool = False) -> None:
        self.use_pallas = use_pallas

    def write_kv_cache(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_scale: torch.Tensor | None = None,
    ) -> None:
        """Scatter ``k, v [T, Hk, D]`` to their slots; slot -1 is sent past the end,
        where XLA's scatter drops the update (no mask, no data-dependent shape).

        :raises UnsupportedFeature: for a ``kv_scale``: the platform declares no scaled (E4M3) cache.
        """
        _refuse_scale(kv_scale)
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        slots = torch.where(slot_mapping < 0, num_slots, slot_mapping)
        k_cache.view(num_slots, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(num_slots, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        kv_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Each token attends to keys ``0 .. context_lens[t] - 1`` of its sequence's
        blocks (with a ``sliding_window`` W, only the last W of them), gathered per token:
        ``[T, max_model_len]`` keys, float32 math.

        Without the per-token layout of :class:`XlaAttentionMetadata` (a caller other
        than the runner) it is derived from the host lengths first. Windowed layers take
        the gathered path also when Pallas is on (the ragged kernel is called unwindowed).

        :raises UnsupportedFeature: for a ``kv_scale``: the platform declares no scaled (E4M3) cache.
        """
        _refuse_scale(kv_scale)
        if self.use_pallas and sliding_window is None:
            return self.ragged_attention(q, k_cache, v_cache, meta, scale)
        num_tokens, num_heads, head_size = q.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        if not isinstance(meta, XlaAttentionMetadata):  # a caller other than TpuRunner: lay it out here
            width = -(-meta.max_seq_len // block_size)
            tables, lens = token_layout(meta, num_tokens, width)
            meta = XlaAttentionMetadata(**vars(meta), token_tables=tables.to(q.device), context_lens=lens.to(q.device))
        offsets = torch.arange(block_size, dtype=torch.int64, device=q.device)
        slots = (meta.token_tables.long().unsqueeze(-1) * block_size + offsets).flatten(1)  # [T, L]
        keys = k_cache.flatten(0, 1)[slots].float()  # [T, L, Hk, D]
        values = v_cache.flatten(0, 1)[slots].float()
        query = q.float().view(num_tokens, num_kv_heads, num_heads // num_kv_heads, head_size)
        scores = torch.einsum("tkgd,tlkd->tkgl", query, keys) * scale
        key_pos = torch.arange(slots.shape[1], dtype=torch.int32, device=q.device)
        visible = key_pos.unsqueeze(0) < meta.context_lens.unsqueeze(1)  # [T, L]
        if sliding_window is not None:  # the query sits at context_lens - 1
            visible &= key_pos.unsqueeze(0) >= meta.context_lens.unsqueeze(1) - sliding_window
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        out = torch.einsum("tkgl,tlkd->tkgd", torch.softmax(scores, dim=-1), values)
        return out.reshape(num_tokens, num_heads, head_size).to(q.dtype)

    def ragged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        use_kernel: bool = True,
    ) -> torch.Tensor:
        """torch_xla's ``ragged_paged_attention``: the Pallas kernel (TPU only), or with
        ``use_kernel=False`` its pure-torch reference, which returns only the real rows
        (how the arguments are checked on XLA:CPU)."""
        from torch_xla.experimental.custom_kernel import ragged_paged_attention

        kv_pages = torch.stack([k_cache, v_cache], dim=3).flatten(2, 3)  # K and V heads interleaved: k0 v0 k1 v1 ...
        num_seqs = torch.tensor([sum(1 for n in meta.query_lens_host if n)], dtype=torch.int32).to(q.device)
        return ragged_paged_attention(
            q,
            kv_pages,
            meta.seq_lens,
            meta.block_tables,
            meta.query_start_loc,
            num_seqs,
            sm_scale=scale,
            use_kernel=use_kernel,
        )
