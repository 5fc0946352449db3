"""The cos/sin table against transformers' rotary embedding, including scaled variants."""

from __future__ import annotations

import pytest
import torch
from core.models.rope import build_cos_sin_cache
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

BASE = dict(hidden_size=128, num_attention_heads=2, max_position_embeddings=512, rope_theta=50000.0)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
SCALINGS = {"default": None, "linear": {"rope_type": "linear", "factor": 4.0}, "llama3": LLAMA3}


def hf_cos_sin(config: LlamaConfig, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = LlamaRotaryEmbedding(config)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(num_positions)[None])
    return cos[0], sin[0]


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_cache_matches_transformers(scaling):
    config = LlamaConfig(**BASE, rope_scaling=SCALINGS[scaling])
    cache = build_cos_sin_cache(config, 64, 512, torch.float32, torch.device("cpu"))
    cos, sin = hf_cos_sin(config, 512)
    assert cache.shape == (512, 64)
    torch.testing.assert_close(cache[:, :32], cos[:, :32], atol=1e-6, rtol=0)
    torch.testing.assert_close(cache[:, 32:], sin[:, :32], atol=1e-6, rtol=0)


def test_gguf_frequency_divisors_reproduce_llama3_scaling():
    """llama.cpp stores Llama 3 scaling as divisors of the plain inverse frequencies (rope_freqs)."""
    plain = LlamaConfig(**BASE)
    scaled = LlamaConfig(**BASE, rope_scaling=LLAMA3)
    exponents = torch.arange(0, 64, 2).float() / 64
    plain_inv = 1.0 / (50000.0**exponents)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled_inv, _ = ROPE_INIT_FUNCTIONS["llama3"](scaled, torch.device("cpu"))
    factors = plain_inv / scaled_inv
    assert factors.max() > 7.9  # the low frequencies really are scaled
    cpu = torch.device("cpu")
    from_factors = build_cos_sin_cache(plain, 64, 512, torch.float32, cpu, freq_factors=factors)
    expected = build_cos_sin_cache(scaled, 64, 512, torch.float32, cpu)
    torch.testing.assert_close(from_factors, expected, atol=1e-5, rtol=0)


def test_cache_in_compute_dtype_and_unsupported_type():
    config = LlamaConfig(**BASE)
    assert build_cos_sin_cache(config, 64, 16, torch.bfloat16, torch.device("cpu")).dtype == torch.bfloat16
    config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="rope type 'dynamic' is not supported; supported: default, "):
        build_cos_sin_cache(config, 64, 16, torch.float32, torch.device("cpu"))
