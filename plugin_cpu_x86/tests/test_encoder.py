"""Encoder kernels (native/src/encoder.cpp): bidirectional attention vs the SDK's torch default,
and ``--quantization bf16`` linears vs torch on the bfloat16-rounded inputs."""

from __future__ import annotations

import pytest
import torch
from plugins.cpu_native.bf16 import Bf16Weight, pack_bf16, reference_bf16_linear
from plugins.errors import UnsupportedFeature

from .conftest import TOLERANCES, rand


def fused_heads(num_tokens, q_heads, kv_heads, head_size, dtype, gen):
    """q, k, v as head views of one [T, Hq + 2 Hk, D] projection output (BERT's layout)."""
    qkv = rand((num_tokens, q_heads + 2 * kv_heads, head_size), dtype, gen)
    return qkv[:, :q_heads], qkv[:, q_heads : q_heads + kv_heads], qkv[:, q_heads + kv_heads :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "seq_lens,q_heads,kv_heads,head_size",
    [
        ([1, 7, 33, 150, 2, 64], 12, 12, 32),  # MiniLM's heads, lengths across the 4-query tiles
        ([300, 5], 4, 4, 64),  # a long sequence beside a short one
        ([17, 3, 40], 8, 2, 128),  # GQA; values in two passes of 4 vectors
        ([9, 4], 4, 4, 24),  # a head size no vector width divides: the plain loops
    ],
)
def test_encoder_attention_matches_the_torch_default(kernels, ref, gen, dtype, seq_lens, q_heads, kv_heads, head_size):
    q, k, v = fused_heads(sum(seq_lens), q_heads, kv_heads, head_size, dtype, gen)
    starts = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32)
    got = kernels.encoder_attention(q, k, v, starts, seq_lens, head_size**-0.5)
    expected = ref.encoder_attention(q, k, v, starts, seq_lens, head_size**-0.5)
    assert got.dtype == dtype and got.shape == q.shape
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol)


def test_encoder_attention_keeps_sequences_apart(kernels, gen):
    """Changing one sequence's keys leaves every other sequence's output as it was."""
    q, k, v = (rand((30, 4, 32), torch.float32, gen) for _ in range(3))
    starts = torch.tensor([0, 10, 25, 30], dtype=torch.int32)
    before = kernels.encoder_attention(q, k, v, starts, [10, 15, 5], 0.2)
    k[10:25] += 1.0
    after = kernels.encoder_attention(q, k, v, starts, [10, 15, 5], 0.2)
    assert torch.equal(before[:10], after[:10]) and torch.equal(before[25:], after[25:])
    assert not torch.equal(before[10:25], after[10:25])


def bf16_kernels(kernels):
    if not kernels.lib.linear_bf16w_ready():
        pytest.skip(f"the {kernels.isa} kernels have no linear_bf16w (AVX512_BF16 builds only)")
    return kernels


def test_packing_holds_the_rounded_weight(gen):
    w = rand((100, 64), torch.float32, gen)
    packed = pack_bf16(w)
    assert packed.packed.shape == (2, 32, 64)  # 100 rows in 2 groups of 64, 32 k-pairs
    assert torch.equal(packed.unpacked(), w.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5, 6, 97, 700])
@pytest.mark.parametrize("out_features,in_features", [(1152, 384), (100, 64), (384, 1536)])
def test_bf16_linear_is_the_product_of_the_rounded_inputs(kernels, gen, dtype, tokens, out_features, in_features):
    kernels = bf16_kernels(kernels)
    w = rand((out_features, in_features), torch.float32, gen)
    bias = rand((out_features,), dtype, gen)
    prepared = kernels.prepare_linear(w, "bf16")
    assert isinstance(prepared, Bf16Weight)
    x = rand((tokens, in_features), dtype, gen)
    for b in (None, bias):
        got = kernels.linear(x, prepared, b)
        assert got.dtype == dtype and got.shape == (tokens, out_features)
        # float32 sums in another order; a bfloat16 output may round the other way
        atol, rtol = (1e-4, 1e-5) if dtype == torch.float32 else TOLERANCES[dtype]
        torch.testing.assert_close(got, reference_bf16_linear(x, prepared, b), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bf16_linear_gelu_in_the_epilogue(kernels, gen, dtype, approximate):
    kernels = bf16_kernels(kernels)
    prepared = kernels.prepare_linear(rand((200, 96), torch.float32, gen), "bf16")
    x, bias = rand((50, 96), dtype, gen, 3.0), rand((200,), torch.float32, gen)
    got = kernels.linear_gelu(x, prepared, bias, approximate)
    atol, rtol = (1e-4, 1e-5) if dtype == torch.float32 else TOLERANCES[dtype]
    torch.testing.assert_close(got, reference_bf16_linear(x, prepared, bias, approximate), atol=atol, rtol=rtol)


def test_bf16_linear_reads_rows_apart_and_leading_dimensions(kernels, gen):
    kernels = bf16_kernels(kernels)
    prepared = kernels.prepare_linear(rand((64, 32), torch.float32, gen), "bf16")
    wide = rand((3, 9, 64), torch.float32, gen)
    x = wide[..., :32]  # rows 64 apart
    got = kernels.linear(x, prepared)
    assert got.shape == (3, 9, 64)
    torch.testing.assert_close(got, reference_bf16_linear(x.contiguous(), prepared), atol=1e-4, rtol=1e-5)


def test_bf16_weights_refused_where_they_cannot_run(kernels, gen):
    if not kernels.lib.linear_bf16w_ready():
        with pytest.raises(UnsupportedFeature, match="AVX512_BF16"):
            kernels.prepare_linear(rand((64, 64), torch.float32, gen), "bf16")
        return
    with pytest.raises(UnsupportedFeature, match="multiple of 32"):
        kernels.prepare_linear(rand((64, 40), torch.float32, gen), "bf16")
    prepared = kernels.prepare_linear(rand((64, 64), torch.float32, gen), "bf16")
    with pytest.raises(ValueError, match="has 32 features, the weight expects 64"):
        kernels.linear(rand((2, 32), torch.float32, gen), prepared)
