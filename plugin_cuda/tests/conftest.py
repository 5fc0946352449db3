"""Shared fixtures of the cuda plugin's tests.

Without a GPU the Triton kernels run under Triton's interpreter on CPU tensors; it
must be switched on before ``triton`` is first imported, hence here. Tests marked
``gpu`` skip with the reason where no usable GPU is present.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if HAS_GPU else "cpu")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped with the reason where none is present)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    from plugin_cuda.detect import probe

    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU: {probe() or 'torch.cuda.is_available() is False'}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class TinyModel:
    """A 2-layer Llama-shaped model whose every hot op goes through ``kernels``."""

    def __init__(self, kernels, dtype: torch.dtype, device: torch.device, seed: int = 0,
                 hidden: int = 32, num_heads: int = 4, num_kv_heads: int = 2, head_size: int = 16,
                 num_layers: int = 2, vocab: int = 64, max_position: int = 128) -> None:  # fmt: skip
        gen = torch.Generator().manual_seed(seed)

        def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=dtype)

        self.kernels = kernels
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.embed = rand(vocab, hidden)
        qkv_out = (num_heads + 2 * num_kv_heads) * head_size
        self.layers = [
            {
                "norm1": 1 + rand(hidden, scale=0.1),
                "qkv": rand(qkv_out, hidden, scale=hidden**-0.5),
                "o": rand(hidden, num_heads * head_size, scale=(num_heads * head_size) ** -0.5),
                "norm2": 1 + rand(hidden, scale=0.1),
                "gate_up": rand(2 * 48, hidden, scale=hidden**-0.5),
                "down": rand(hidden, 48, scale=48**-0.5),
            }
            for _ in range(num_layers)
        ]
        self.final_norm = 1 + rand(hidden, scale=0.1)
        inv = 1.0 / (10000 ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv)
        self.cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)

    def __call__(self, input_ids, positions, kv_caches, meta):
        k = self.kernels
        x = self.embed[input_ids]
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            if residual is None:
                h, residual = k.rms_norm(x, layer["norm1"], 1e-6), x
            else:
                h, residual = k.fused_add_rms_norm(x, residual, layer["norm1"], 1e-6)
            qkv = k.linear(h, layer["qkv"])
            q_end = self.num_heads * self.head_size
            kv_end = q_end + self.num_kv_heads * self.head_size
            q = qkv[:, :q_end].view(-1, self.num_heads, self.head_size)  # strided views, as a model passes them
            key = qkv[:, q_end:kv_end].view(-1, self.num_kv_heads, self.head_size)
            value = qkv[:, kv_end:].view(-1, self.num_kv_heads, self.head_size)
            q, key = k.rotary_embedding(positions, q, key, self.cos_sin)
            k.write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
            attn = k.paged_attention(q, k_cache, v_cache, meta, self.head_size**-0.5)
            x = k.linear(attn.reshape(attn.shape[0], -1), layer["o"])
            h, residual = k.fused_add_rms_norm(x, residual, layer["norm2"], 1e-6)
            x = k.linear(k.silu_and_mul(k.linear(h, layer["gate_up"])), layer["down"])
        out, _ = k.fused_add_rms_norm(x, residual, self.final_norm, 1e-6)
        return out

    def new_kv_caches(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (num_blocks, block_size, self.num_kv_heads, self.head_size)
        dtype, device = self.embed.dtype, self.embed.device
        return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in self.layers]  # fmt: skip


@pytest.fixture
def tiny_model():
    """``tiny_model(kernels, dtype)`` -> a :class:`TinyModel` on the test device."""

    def make(kernels, dtype: torch.dtype = torch.float32, **kwargs) -> TinyModel:
        return TinyModel(kernels, dtype, DEVICE, **kwargs)

    return make


class ReplayByRerun:
    """Graph stand-in: capture runs ``fn`` once; replay re-runs it into the same output."""

    def __init__(self) -> None:
        self.captured: list[int] = []
        self.replays = 0
        self._outputs: dict = {}

    def new_pool(self):
        return None

    def warm_up(self, fn) -> None:
        fn()

    def capture(self, fn, pool):
        out = fn()
        self.captured.append(out.shape[0])
        self._outputs[fn] = out
        return fn, out

    def replay(self, graph) -> None:
        self.replays += 1
        self._outputs[graph].copy_(graph())

    def free_memory(self) -> int:
        return 0


@pytest.fixture(scope="session")
def replay_by_rerun():
    """:class:`ReplayByRerun` (under ``--import-mode=importlib`` tests cannot import conftest)."""
    return ReplayByRerun
