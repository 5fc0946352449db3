"""An explicit description of a model's weights and caches, for runners that run it natively.

Core's models describe themselves (``model.describe(kv_caches)``) as a
:class:`ModelDescription`: the dims, and each layer's weights and KV caches as the
objects the forward pass uses. A runner that replaces the Python forward pass with
its own (one native call a step, a compiled graph) reads this instead of the model's
classes, so it depends on this SDK module only, never on core.

The architecture described is the Llama family (Llama, Qwen2, Mistral, Qwen3, Phi-3,
Qwen3-MoE, Mixtral): ``h = embed(ids)``; each layer: ``x = rmsnorm(h) -> qkv -> [q/k
head norms] -> rope(q, k) -> paged attention -> o``, residual add, ``rmsnorm -> MLP``,
residual add; then a final ``rmsnorm``. The MLP is ``gate_up -> silu(gate) * up -> down``,
or in a mixture-of-experts layer (:class:`MoEWeights`) each token's ``top_k`` experts'
MLPs weighted by the router. RMSNorms fold the residual add in (as :meth:`Kernels.rms_norm`).
A runner that does not run an optional part (q/k norms, experts) checks for it and declines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from plugins.lora import LoRAWeights


@dataclass(frozen=True)
class LinearWeights:
    """One linear layer ``y = x @ W.T + b``.

    :ivar weight: the weight as the platform's ``Kernels.prepare_linear`` returned it
        (a ``[out, in]`` tensor, or the platform's own prepared/quantized object).
    :ivar bias: ``[out]`` or None.
    :ivar lora: the linear's LoRA adapter slots (:class:`plugins.lora.LoRAWeights`), None when
        LoRA is off: a step's adapter rows (``ModelInputs.lora``) add their deltas to the output.
    """

    weight: Any
    bias: torch.Tensor | None
    in_features: int
    out_features: int
    lora: LoRAWeights | None = None


@dataclass(frozen=True)
class MoEWeights:
    """A sparse mixture-of-experts MLP: ``router`` scores ``num_experts`` experts per token;
    the ``top_k`` highest softmax probabilities (renormalized to sum to 1 when ``renormalize``)
    weight those experts' outputs (``Kernels.fused_moe``).

    :ivar experts: as the platform's ``Kernels.prepare_experts`` returned them.
    :ivar intermediate_size: each expert's (this rank's part of it under tensor parallelism).
    """

    router: LinearWeights
    experts: Any
    num_experts: int
    top_k: int
    renormalize: bool
    intermediate_size: int


@dataclass(frozen=True)
class LayerDescription:
    """One decoder layer: its norms, projections and its slice of the KV cache.

    :ivar qkv: q, k and v projections fused by rows (q first): ``[heads + 2 * kv_heads] * head_dim`` outputs.
    :ivar gate_up: gate and up projections fused by rows (gate first): ``2 * intermediate_size``
        outputs; None in a mixture-of-experts layer (then :attr:`moe`), as is ``down``.
    :ivar k_cache: ``[num_blocks, block_size, kv_heads, head_dim]`` (see :mod:`plugins.attention`).
    :ivar kv_scale: ``float32 [2]`` (K, V) scales of an E4M3 cache, else None (:mod:`plugins.kv_cache`).
    :ivar q_norm: ``[head_dim]`` RMSNorm weight applied to each query head before the rotation
        (Qwen3), else None; ``k_norm`` the same for the key heads.
    :ivar moe: the layer's mixture-of-experts MLP, else None.
    """

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    qkv: LinearWeights
    o: LinearWeights
    gate_up: LinearWeights | None
    down: LinearWeights | None
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_scale: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    moe: MoEWeights | None = None


@dataclass(frozen=True)
class ModelDescription:
    """A Llama-family decoder, described for a native runner (see the module docstring).

    :ivar dtype: the compute dtype of activations and the embedding (the KV caches'
        dtype is their own: the compute dtype or a one-byte :mod:`plugins.kv_cache` dtype).
    :ivar cos_sin: rotary table ``[max_positions, head_dim]``: cos in the first half, sin in the second.
    :ivar intermediate_size: the dense MLPs' (each expert's is in its layer's :class:`MoEWeights`).
    :ivar attn_scale: the softmax scale of attention (``head_dim ** -0.5``).
    :ivar tie_word_embeddings: whether the LM head reuses :attr:`embedding` (logits are
        computed by core, outside the runner; informational).
    :ivar sliding_window: every layer's attention window (Mistral's ``sliding_window``: each
        query sees its last ``sliding_window`` positions), None for the whole context.
    :ivar vocab_size: ids a token may have; :attr:`embedding` holds rows ``[vocab_start,
        vocab_start + embedding.shape[0])`` of them (all of them unless tensor parallel).
    :ivar embedding: the embedding table; None on a pipeline stage after the first (which takes
        the previous stage's hidden states and residual, :class:`plugins.runner.ModelInputs`).
    :ivar final_norm: the final RMSNorm's weight; None on a pipeline stage before the last (which
        returns its hidden states and residual). A runner that runs whole models only checks both.
    :ivar comm: a tensor-parallel rank's communicator (:class:`plugins.distributed.Communicator`),
        None when the model is not split. A split model's layers hold this rank's heads and part
        of the MLP (``intermediate_size`` is this rank's part); the sums of the ranks' embedding
        rows (an id outside :attr:`embedding`'s rows embeds as zeros), o and down projections
        (their bias is on rank 0 alone) are the unsplit model's values (``comm.all_reduce``).
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
    embedding: torch.Tensor | None
    final_norm: torch.Tensor | None
    cos_sin: torch.Tensor
    tie_word_embeddings: bool
    sliding_window: int | None = None
    vocab_start: int = 0
    comm: Any | None = None
