"""Shared model layers whose hot ops go through a platform's :class:`plugins.kernels.Kernels`.

Every layer is created empty and receives its weights once at load time; linear
weights pass through ``kernels.prepare_linear`` so a backend can repack or quantize
them. Nothing here knows about a device: the kernels object does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from plugins.attention import AttentionMetadata
from plugins.int_quant import IntWeight, concat_int_weights
from plugins.kernels import GGUFWeight, Kernels
from torch import nn

from core.partition.tensor_parallel import TensorParallel


def concat_rows(parts: list[Any]) -> Any:
    """Stack weights (or biases) along their output dimension, for fused projections.

    Dense tensors are concatenated; GGUF block-quantized weights of one type and width
    are fused by concatenating their raw rows (each row is quantized on its own), integer-
    quantized checkpoint weights of one scheme by concatenating codes, scales and zero points.
    """
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts, dim=0)
    if all(isinstance(p, IntWeight) for p in parts):
        return concat_int_weights(parts)
    if all(isinstance(p, GGUFWeight) for p in parts):
        qtypes = {p.qtype for p in parts}
        widths = {p.cols for p in parts}
        if len(qtypes) == 1 and len(widths) == 1:
            return GGUFWeight(
                qtype=parts[0].qtype,
                data=torch.cat([p.data for p in parts], dim=0),
                rows=sum(p.rows for p in parts),
                cols=parts[0].cols,
            )
    kinds = [p.qtype if isinstance(p, GGUFWeight) else type(p).__name__ if isinstance(p, IntWeight)
             else f"dense {tuple(p.shape)}" for p in parts]  # fmt: skip
    raise ValueError(f"cannot fuse weights of different kinds into one linear: {kinds}")


def held_bytes(obj: Any, seen: set[int]) -> int:
    """Bytes of the tensors reachable from ``obj`` (a tensor, a prepared weight, a container).

    ``seen`` holds the tensors already counted, by where their bytes start (or, without
    addressable data, by tensor id), so shared (tied) weights count once. A tensor counts its
    own bytes, not its storage's: weights copied into one shared mapping (the CPU plugins'
    huge-page arena) are views of a storage larger than they are.
    """
    if isinstance(obj, torch.Tensor):
        size = obj.nelement() * obj.element_size()
        try:
            key = obj.data_ptr()
        except RuntimeError:  # no addressable storage (lazy tensors): the tensor object itself
            key = id(obj)
        if key in seen:
            return 0
        seen.add(key)
        return size
    if isinstance(obj, dict):
        return sum(held_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(held_bytes(v, seen) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(held_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    if hasattr(obj, "__dict__") and not isinstance(obj, nn.Module):
        return sum(held_bytes(v, seen) for v in vars(obj).values())
    return 0


class Linear(nn.Module):
    """``y = x @ W.T + b`` through ``kernels.linear`` on a weight from ``kernels.prepare_linear``.

    With LoRA enabled, ``lora`` (:class:`core.lora.stacks.StackedLoRA`) adds the step's adapter
    deltas to that output; without it (None) nothing else runs.
    """

    def __init__(self, kernels: Kernels, in_features: int, out_features: int, has_bias: bool) -> None:
        super().__init__()
        self.kernels = kernels
        self.in_features = in_features
        self.out_features = out_features
        self.has_bias = has_bias
        self.weight: Any = None
        self.bias: torch.Tensor | None = None
        self.lora: Any = None

    def load(
        self, weight: torch.Tensor | GGUFWeight | IntWeight, bias: torch.Tensor | None, quantization: str | None
    ) -> None:
        """Check the shape of ``weight`` and hand it to the kernels once."""
        rows, cols = tuple(weight.shape) if isinstance(weight, torch.Tensor) else (weight.rows, weight.cols)
        if (rows, cols) != (self.out_features, self.in_features):
            raise ValueError(
                f"linear weight has shape [{rows}, {cols}], expected [{self.out_features}, {self.in_features}]"
            )
        if self.has_bias != (bias is not None):
            raise ValueError(f"linear bias {'missing' if self.has_bias else 'unexpected'} for [{rows}, {cols}] weight")
        self.weight = self.kernels.prepare_linear(weight, quantization)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.kernels.linear(x, self.weight, self.bias)
        return out if self.lora is None else self.lora(x, out)


class RMSNorm(nn.Module):
    """RMSNorm via ``kernels.rms_norm``; with a residual, the fused add-and-norm kernel."""

    def __init__(self, kernels: Kernels, eps: float) -> None:
        super().__init__()
        self.kernels = kernels
        self.eps = eps
        self.weight: torch.Tensor | None = None

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        return self.kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    """Self-attention over the paged KV cache with a fused QKV projection and rotary embedding."""

    def __init__(
        self,
        kernels: Kernels,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        qkv_bias: bool,
        o_bias: bool,
        scale: float | None = None,
        sliding_window: int | None = None,
        qk_norm_eps: float | None = None,
        tp: TensorParallel | None = None,
    ) -> None:
        """``num_heads``/``num_kv_heads``: this rank's heads.

        :param scale: the softmax scale (default ``head_size ** -0.5``).
        :param sliding_window: attend to the last ``sliding_window`` positions only (a local layer).
        :param qk_norm_eps: RMS-normalize each head of q and k before the rotation (Gemma 3).
        :param tp: sums the row-parallel output over tensor-parallel ranks.
        """
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive number of tokens, got {sliding_window}")
        self.kernels = kernels
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.q_size = num_heads * head_size
        self.kv_size = num_kv_heads * head_size
        self.scale = head_size**-0.5 if scale is None else scale
        self.sliding_window = sliding_window
        self.qkv_proj = Linear(kernels, hidden_size, self.q_size + 2 * self.kv_size, qkv_bias)
        self.o_proj = Linear(kernels, self.q_size, hidden_size, o_bias)
        self.tp = tp
        self.q_norm = RMSNorm(kernels, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(kernels, qk_norm_eps) if qk_norm_eps is not None else None

    @classmethod
    def from_config(cls, config: Any, kernels: Kernels, head_size: int, **options: Any) -> Attention:
        """Attention with the sizes of a Hugging Face ``config``; ``options`` as for the constructor."""
        hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        return cls(kernels, hidden, heads, kv_heads, head_size, **options)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: tuple[torch.Tensor, ...],
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # head views of the fused projection, no copies: kernels take any token stride (the kit checks it)
        q = q.reshape(num_tokens, self.num_heads, self.head_size)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_size)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_size)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.kernels.rotary_embedding(positions, q, k, cos_sin_cache)
        k_cache, v_cache, *scales = kv_cache  # an E4M3 cache comes with its scales
        kv_scale = scales[0] if scales else None
        self.kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping, kv_scale=kv_scale)
        out = self.kernels.paged_attention(
            q, k_cache, v_cache, meta, self.scale, sliding_window=self.sliding_window, kv_scale=kv_scale
        )
        out = self.o_proj(out.reshape(num_tokens, self.q_size))
        return self.tp.all_reduce(out) if self.tp is not None else out


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused into one linear.

    ``activation``: a Hugging Face ``hidden_act`` name, ``"silu"`` or ``"gelu_pytorch_tanh"``;
    ``intermediate_size``: this rank's part; ``tp`` sums the row-parallel down projection.
    """

    def __init__(
        self,
        kernels: Kernels,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        activation: str = "silu",
        tp: TensorParallel | None = None,
    ) -> None:
        super().__init__()
        acts = {"silu": kernels.silu_and_mul, "gelu_pytorch_tanh": kernels.gelu_tanh_and_mul}
        if activation not in acts:
            raise ValueError(f"unsupported MLP activation {activation!r}; supported: {', '.join(acts)}")
        self.act_and_mul = acts[activation]
        self.gate_up_proj = Linear(kernels, hidden_size, 2 * intermediate_size, bias)
        self.down_proj = Linear(kernels, intermediate_size, hidden_size, bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.act_and_mul(self.gate_up_proj(x)))
        return self.tp.all_reduce(out) if self.tp is not None else out
