"""Megatron-style sharding of a Llama-family checkpoint over tensor-parallel ranks.

:class:`ShardPlan` says, for each Hugging Face weight name, which slice a rank keeps:

- column-parallel (output rows split): q/k/v, gate/up, and the vocabulary rows of the
  embedding and lm_head; a projection stored fused (Phi-3's ``qkv_proj``, ``gate_up_proj``)
  keeps its rows of each part, in order (:class:`FusedRows`);
- row-parallel (input columns split): o_proj and down_proj, whose partial outputs the
  model sums with an all-reduce; their bias is added once (rank 0 keeps it, the
  other ranks hold zeros);
- KV heads are split across ranks, or replicated when there are fewer KV heads than
  ranks (rank ``r`` then keeps KV head ``r // (world_size // num_kv_heads)``);
- mixture-of-experts layers: every expert is split along its intermediate dimension as a
  gated MLP is (gate/up rows, down columns, for one expert's matrix or a stack of them);
  the router is replicated;
- norms and rope tables are replicated.

The loaders read only a rank's slice (safetensors slices, GGUF byte ranges), so no
process holds the full model. GGUF block-quantized rows are cut at block boundaries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from plugins.kernels import GGUFWeight

_LAYER_WEIGHT = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.(\w+)\.(weight|bias)")
# one expert's projection (Qwen3-MoE, Mixtral names) or every expert's stacked (GGUF)
_EXPERT_WEIGHT = re.compile(
    r"model\.layers\.\d+\.(?:mlp|block_sparse_moe)\.experts\.(?:\d+\.)?(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight"
)


@dataclass(frozen=True)
class Slice:
    """Keep ``[start, stop)`` along ``dim`` (0: output rows, 1: input columns); ``zero``: hold zeros."""

    dim: int
    start: int
    stop: int
    zero: bool = False


_ZEROS = Slice(0, 0, 0, zero=True)


@dataclass(frozen=True)
class FusedRows:
    """Output rows of a projection stored fused (q/k/v, or gate/up): each part's ``[start, stop)``
    rows of the stored tensor, kept one after the other."""

    parts: tuple[Slice, ...]


def split_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s part ``[start, stop)`` of ``n`` items in ``ceil(n / world_size)`` chunks (the last may be short)."""
    per_rank = -(-n // world_size)
    return min(rank * per_rank, n), min((rank + 1) * per_rank, n)


class ShardPlan:
    """What rank ``rank`` of ``world_size`` holds of a Llama-family model with ``config``.

    :raises ValueError: when the model's heads or intermediate size do not split evenly
        over ``world_size`` ranks (naming the dimension and the sizes that would work).
    """

    def __init__(self, config: Any, head_size: int, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [0, {world_size})")
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        inter, vocab = config.intermediate_size, config.vocab_size
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        _need_divisible("intermediate_size", inter, world_size)
        expert_inter = getattr(config, "moe_intermediate_size", None) or inter  # Mixtral's experts: intermediate_size
        _need_divisible("moe_intermediate_size", expert_inter, world_size)
        group = heads // kv_heads  # query heads per KV head; a rank holds whole groups or an equal part of one
        if kv_heads >= world_size:  # split the KV heads (unevenly when they do not divide: 3 over 2 is 1 + 2)
            kv_first, kv_stop = rank * kv_heads // world_size, (rank + 1) * kv_heads // world_size
            q_first, num_q = kv_first * group, (kv_stop - kv_first) * group
        else:  # replicate: each KV head serves world_size / kv_heads ranks, which share its query heads
            per_kv = world_size // kv_heads
            if world_size % kv_heads or group % per_kv:
                raise ValueError(
                    f"{kv_heads} KV heads with {group} query heads each cannot be shared evenly by "
                    f"tensor_parallel_size={world_size} ranks: use at most {kv_heads} ranks or a divisor of {heads}"
                )
            kv_first, kv_stop = rank // per_kv, rank // per_kv + 1
            num_q = group // per_kv
            q_first = kv_first * group + (rank % per_kv) * num_q
        self.rank = rank
        self.world_size = world_size
        self.head_size = head_size
        self.num_heads = num_q
        self.num_kv_heads = kv_stop - kv_first
        self.intermediate_size = inter // world_size
        self.vocab_size = vocab
        self.vocab_start, self.vocab_stop = split_range(vocab, rank, world_size)
        self.vocab_per_rank = -(-vocab // world_size)
        q0 = q_first * head_size
        k0 = kv_first * head_size
        i0 = rank * self.intermediate_size
        rows_q = Slice(0, q0, q0 + self.num_heads * head_size)
        rows_kv = Slice(0, k0, k0 + self.num_kv_heads * head_size)
        rows_i = Slice(0, i0, i0 + self.intermediate_size)
        self._slices = {
            "q_proj": (rows_q, rows_q),
            "k_proj": (rows_kv, rows_kv),
            "v_proj": (rows_kv, rows_kv),
            "gate_proj": (rows_i, rows_i),
            "up_proj": (rows_i, rows_i),
            "o_proj": (Slice(1, rows_q.start, rows_q.stop), None),
            "down_proj": (Slice(1, i0, rows_i.stop), None),
        }
        # stored fused (Phi-3): this rank's q, k and v rows, its gate and up rows, each part's own
        q_total, kv_total = heads * head_size, kv_heads * head_size
        qkv = FusedRows((rows_q, _shift(rows_kv, q_total), _shift(rows_kv, q_total + kv_total)))
        gate_up_rows = FusedRows((rows_i, _shift(rows_i, inter)))
        self._slices |= {"qkv_proj": (qkv, qkv), "gate_up_proj": (gate_up_rows, gate_up_rows)}
        e0, e1 = split_range(expert_inter, rank, world_size)
        gate_up, down = Slice(0, e0, e1), Slice(1, e0, e1)  # Mixtral's w1/w3 are gate/up, w2 down
        self._expert_slices = dict(gate_proj=gate_up, up_proj=gate_up, w1=gate_up, w3=gate_up, down_proj=down, w2=down)
        self._vocab_rows = Slice(0, self.vocab_start, self.vocab_stop)

    @property
    def is_sharded(self) -> bool:
        return self.world_size > 1

    def slice_for(self, name: str) -> Slice | FusedRows | None:
        """The part of weight ``name`` (a Hugging Face name) this rank keeps; None: all of it.
        For a stack of experts' matrices ``[E, rows, cols]`` the slice is of each expert's."""
        if not self.is_sharded:
            return None
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return self._vocab_rows
        if expert := _EXPERT_WEIGHT.fullmatch(name):
            return self._expert_slices[expert[1]]
        match = _LAYER_WEIGHT.fullmatch(name)
        if match is None or match[2] not in self._slices:
            return None  # norms, rope tables: replicated
        weight_slice, bias_slice = self._slices[match[2]]
        if match[3] == "weight":
            return weight_slice
        if bias_slice is None and self.rank != 0:
            return _ZEROS  # a row-parallel bias is added once, after the sum: rank 0 keeps it
        return bias_slice


def _shift(part: Slice, offset: int) -> Slice:
    return Slice(part.dim, part.start + offset, part.stop + offset)


def _need_divisible(what: str, n: int, world_size: int) -> None:
    if n % world_size:
        sizes = [d for d in range(1, n + 1) if n % d == 0 and d <= 16]
        raise ValueError(
            f"{what}={n} is not divisible by tensor_parallel_size={world_size}; sizes that divide it: {sizes}"
        )


def slice_dense(source: Any, part: Slice | FusedRows | None) -> torch.Tensor:
    """Read ``part`` of a dense tensor or a lazy slice handle (safetensors ``get_slice``, mmap'd tensor).

    Only the slice is read into memory; ``Slice.zero`` gives zeros of the full shape. A
    column slice is made contiguous (native kernels read a weight's rows back to back).
    """
    if isinstance(part, FusedRows):
        return torch.cat([slice_dense(source, p) for p in part.parts])
    if part is None:
        return source[:]
    if part.zero:
        return torch.zeros_like(source[:])
    return source[part.start : part.stop] if part.dim == 0 else source[:, part.start : part.stop].contiguous()


def gguf_byte_columns(qtype: str, cols: int, part: Slice) -> tuple[int, int]:
    """Byte range ``[lo, hi)`` within each stored row for input columns ``[part.start, part.stop)``.

    :raises ValueError: when the columns do not fall on the format's block boundaries.
    """
    import gguf

    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    if part.start % block or part.stop % block:
        raise ValueError(
            f"a {qtype} weight of {cols} columns cannot be split at column {part.start}-{part.stop}: "
            f"{qtype} blocks hold {block} values; choose a tensor_parallel_size that keeps blocks whole"
        )
    return part.start // block * type_size, part.stop // block * type_size


def slice_gguf(weight: GGUFWeight, part: Slice | None) -> GGUFWeight:
    """``part`` of a quantized weight in its stored form (rows are independent; columns cut at blocks)."""
    if part is None:
        return weight
    if part.dim == 0:
        return GGUFWeight(weight.qtype, weight.data[part.start : part.stop], part.stop - part.start, weight.cols)
    lo, hi = gguf_byte_columns(weight.qtype, weight.cols, part)
    return GGUFWeight(weight.qtype, weight.data[:, lo:hi].contiguous(), weight.rows, part.stop - part.start)
