"""What tests and benchmarks of backends and of the engine share: the reference platform
every backend is compared with, a resolved engine config with small defaults, and the
tiny random decoder the end-to-end tests build. No pytest needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from plugins.byteorder import GGUF_BLOCK_FIELDS
from plugins.config import EngineConfigView
from plugins.gguf_quants import FORMATS
from plugins.kernels import GGUFWeight
from plugins.platform import Platform

#: the tiny random decoder of the end-to-end tests: transformers config arguments that
#: fit Llama, Qwen2 and Mistral configs alike (random weights, built in a fraction of a second)
TINY_MODEL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


class ReferencePlatform(Platform):
    """The SDK's own defaults on the CPU (torch reference kernels, eager runner, host-memory
    profiler): what every backend is compared with, in tests and benchmarks."""

    name = "reference"
    device_type = "cpu"
    priority = 0
    supported_kv_cache_dtypes = ("bfloat16", "float16", "fp8_e4m3", "fp8_e5m2")

    def unavailable_reason(self) -> str | None:
        return None  # torch on the host CPU


def tiny_model_config(config_cls: Any = None, **overrides: Any) -> Any:
    """A transformers config (``LlamaConfig`` unless ``config_cls``) of :data:`TINY_MODEL`
    with ``overrides`` applied."""
    if config_cls is None:
        from transformers import LlamaConfig as config_cls
    return config_cls(**{**TINY_MODEL, **overrides})


def engine_config(**overrides: Any) -> EngineConfigView:
    """A resolved :class:`plugins.EngineConfigView` for tests: the declared defaults, on the
    reference platform in float32 with small lengths, and ``overrides``."""
    small = dict(device="reference", dtype="float32", max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512)
    return EngineConfigView(**{**small, **overrides})


def random_gguf_weight(qtype: str, rows: int, cols: int, seed: int = 0, scale: float = 0.05) -> GGUFWeight:
    """``rows`` rows of ``qtype`` blocks with random bytes in every field, for kernel and loader
    tests (the ``gguf`` package cannot quantize to the K-quants); the float16 scales are finite,
    drawn from ``N(0, scale)`` (random bytes there could be NaN or inf)."""
    size, f16_offsets = GGUF_BLOCK_FIELDS[qtype]
    blocks = cols // FORMATS[qtype][0]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    for offset in f16_offsets:
        scales = rng.normal(0, scale, (rows, blocks)).astype(np.float16)
        data[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(rows, blocks, 2)
    return GGUFWeight(qtype, torch.from_numpy(data.reshape(rows, -1)), rows, cols)
