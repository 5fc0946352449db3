"""What tests and benchmarks of backends and of the engine share: the reference platform
every backend is compared with, a resolved engine config with small defaults, and the
tiny random decoder the end-to-end tests build. No pytest needed.
"""

from __future__ import annotations

from typing import Any

from plugins.config import EngineConfigView
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


def tiny_model_config(config_cls: Any = None, **overrides: Any) -> Any:
    """A transformers config (``LlamaConfig`` unless ``config_cls``) of :data:`TINY_MODEL`
    with ``overrides`` applied."""
    if config_cls is None:
        from transformers import LlamaConfig as config_cls
    return config_cls(**{**TINY_MODEL, **overrides})


def engine_config(**overrides: Any) -> EngineConfigView:
    """A fully resolved :class:`plugins.EngineConfigView` with small defaults, for tests."""
    fields = dict(
        model=None, device="reference", dtype="float32", quantization=None, max_model_len=512, max_num_seqs=8,
        max_num_batched_tokens=512, block_size=16, enable_prefix_caching=True, enable_chunked_prefill=True, seed=0,
        enforce_eager=False, kv_cache_bytes=None, gpu_memory_utilization=0.9, served_model_name=None,
    )  # fmt: skip
    return EngineConfigView(**{**fields, **overrides})
