"""An explicit description of a model's weights and caches, for runners that run it natively.

Core's models describe themselves (``model.describe(kv_caches)``) as a
:class:`ModelDescription`: the dims, and each layer's weights and KV caches as the
objects the forward pass uses. A runner that replaces the Python forward pass with
its own (one native call a step, a compiled graph) reads this instead of the model's
classes, so it depends on this SDK module only, never on core.

The architecture described is the Llama family (Llama, Qwen2, Mistral):
``h = embed(ids)``; each layer: ``x = rmsnorm(h) -> qkv -> rope(q, k) -> paged attention
-> o``, residual add, ``rmsnorm -> gate_up -> silu(gate) * up -> down``, residual add;
then a final ``rmsnorm``. RMSNorms fold the residual add in (as :meth:`Kernels.rms_norm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LinearWeights:
    """One linear layer ``y = x @ W.T + b``.

    :ivar weight: the weight as the platform's ``Kernels.prepare_linear`` returned it
        (a ``[out, in]`` tensor, or the platform's own prepared/quantized object).
    :ivar bias: ``[out]`` or None.
    """

    weight: Any
    bias: torch.Tensor | None
    in_features: int
    out_features: int


@dataclass(frozen=True)
class LayerDescription:
    """One decoder layer: its norms, projections and its slice of the KV cache.

    :ivar qkv: q, k and v projections fused by rows (q first): ``[heads + 2 * kv_heads] * head_dim`` outputs.
    :ivar gate_up: gate and up projections fused by rows (gate first): ``2 * intermediate_size`` outputs.
    :ivar k_cache: ``[num_blocks, block_size, kv_heads, head_dim]`` (see :mod:`plugins.attention`).
    :ivar kv_scale: ``float32 [2]`` (K, V) scales of an E4M3 cache, else None (:mod:`plugins.kv_cache`).
    """

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    qkv: LinearWeights
    o: LinearWeights
    gate_up: LinearWeights
    down: LinearWeights
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class ModelDescription:
    """A Llama-family decoder, described for a native runner (see the module docstring).

    :ivar dtype: the compute dtype of activations and the embedding (the KV caches'
        dtype is their own: the compute dtype or a one-byte :mod:`plugins.kv_cache` dtype).
    :ivar cos_sin: rotary table ``[max_positions, head_dim]``: cos in the first half, sin in the second.
    :ivar attn_scale: the softmax scale of attention (``head_dim ** -0.5``).
    :ivar tie_word_embeddings: whether the LM head reuses :attr:`embedding` (logits are
        computed by core, outside the runner; informational).
    :ivar sliding_window: every layer's attention window (Mistral's ``sliding_window``: each
        query sees its last ``sliding_window`` positions), None for the whole context.
    """

    layers: tuple[LayerDescription, ...]
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    attn_scale: float
    dtype: torch.dtype
    embedding: torch.Tensor
    final_norm: torch.Tensor
    cos_sin: torch.Tensor
    tie_word_embeddings: bool
    sliding_window: int | None = None
