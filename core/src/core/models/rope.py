"""The rotary-embedding cos/sin table, computed once per model exactly as transformers does.

Scaled variants (``linear``, ``llama3``, ``yarn``, ``longrope``, ...) come from transformers'
``ROPE_INIT_FUNCTIONS`` so that their inverse frequencies match Hugging Face bit for bit.
LongRoPE (Phi-3) rotates positions below ``original_max_position_embeddings`` with its short
factors and the rest with its long ones, as vLLM does (transformers switches a whole
sequence to the long factors once it passes that length).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def _rope_settings(config: Any, layer_type: str | None) -> tuple[str, float]:
    """(rope type, base theta) from a config of transformers 5 (``rope_parameters``) or 4 (``rope_scaling``).

    Models with per-layer-type rope (Gemma 3) nest the parameters under the layer type.
    """
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if layer_type is not None:
        params = params[layer_type]
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope_type, float(theta)


def build_cos_sin_cache(
    config: Any,
    head_size: int,
    max_position: int,
    dtype: torch.dtype,
    device: torch.device,
    freq_factors: torch.Tensor | None = None,
    layer_type: str | None = None,
) -> torch.Tensor:
    """Return ``[max_position, head_size]``: cos in the first half of each row, sin in the second.

    :param freq_factors: optional per-frequency divisors of the inverse frequencies
        (llama.cpp's ``rope_freqs`` tensor, which encodes Llama 3 scaling in GGUF files).
    :param layer_type: the key of this table's parameters in a per-layer-type
        ``config.rope_parameters`` (``"sliding_attention"``, ``"full_attention"``).
    """
    params = getattr(config, "rope_parameters", None) or {}
    partial = getattr(config, "partial_rotary_factor", None) or params.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ValueError(f"partial rotary embeddings are not supported (partial_rotary_factor={partial})")
    rope_type, theta = _rope_settings(config, layer_type)
    if rope_type == "default":
        exponents = torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size
        inv_freq, attention_scaling = 1.0 / (theta**exponents), 1.0
    elif rope_type in ROPE_INIT_FUNCTIONS and rope_type != "dynamic":
        extra = {} if layer_type is None else {"layer_type": layer_type}
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), **extra)
    else:
        supported = ", ".join(["default", *sorted(k for k in ROPE_INIT_FUNCTIONS if k != "dynamic")])
        raise ValueError(f"rope type {rope_type!r} is not supported; supported: {supported}")
    inv_freq = inv_freq.float()
    if inv_freq.shape[0] != head_size // 2:
        raise ValueError(f"rope has {inv_freq.shape[0]} frequencies, expected head_size/2 = {head_size // 2}")
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.float().cpu()
    positions = torch.arange(max_position, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    original = params.get("original_max_position_embeddings") if rope_type == "longrope" else None
    if original is not None and max_position > original:
        long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"), seq_len=max_position)
        freqs[original:] = positions[original:, None] * long_inv_freq.float()[None, :]
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_scaling
    return cache.to(device=device, dtype=dtype)
