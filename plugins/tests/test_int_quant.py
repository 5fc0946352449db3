"""The SDK's reading of quantized checkpoint layouts vs compressed-tensors' own decompression.

Random weights are quantized (round to nearest) and compressed by the ``compressed-tensors``
package; :func:`plugins.int_quant.from_compressed` must give back exactly the weight its
decompression gives. The legacy AutoGPTQ and AutoAWQ layouts are written from the same
codes and checked against the formulas of those projects' dequantization, written here.
"""

from __future__ import annotations

import pytest
import torch
from plugins.int_quant import IntWeight, act_order, from_awq, from_compressed, from_gptq, quantize_activations_per_token
from plugins.testing.quant import compress_weight, scheme, to_awq, to_gptq

pytest.importorskip("compressed_tensors")

#: (bits, symmetric, group size or None for per channel, int8 activations)
SCHEMES = [
    (8, True, None, True),  # W8A8 (int-quantized)
    (8, True, None, False),  # W8A16 per channel
    (8, True, 64, False),
    (8, False, 32, False),
    (4, True, 32, False),  # W4A16
    (4, False, 64, False),  # W4A16 asymmetric, as AWQ makes them
    (4, True, None, False),
    (4, False, None, False),
]


def compressed(bits, symmetric, group_size, a8, rows=48, cols=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=gen) * 0.05 + 0.01  # off-centre: zero points matter
    stored, decompressed = compress_weight(weight, scheme(bits, symmetric, group_size, a8))
    packed = "weight_packed" in stored
    acts = "int8_per_token" if a8 else None
    return from_compressed(stored, bits, group_size, packed, acts), decompressed, stored


@pytest.mark.parametrize("bits,symmetric,group_size,a8", SCHEMES)
def test_compressed_tensors_layouts_match_its_decompression(bits, symmetric, group_size, a8):
    weight, decompressed, stored = compressed(bits, symmetric, group_size, a8)
    assert ("weight_packed" in stored) == (not a8), sorted(stored)  # W8A8 is int-quantized, the rest packed
    assert weight.rows == 48 and weight.cols == 128
    assert (weight.zeros is None) == symmetric
    assert torch.equal(weight.dequantize(), decompressed)
    assert int(weight.codes.min()) >= -(1 << (bits - 1)) and int(weight.codes.max()) < 1 << (bits - 1)


def gptq_reference(t: dict[str, torch.Tensor], bits: int) -> torch.Tensor:
    """AutoGPTQ's dequantization, field by field: ``scale[g_idx[k]] * (q[k] - (qzero[g_idx[k]] + 1))``."""
    per, mask = 32 // bits, (1 << bits) - 1
    qweight, qzeros, g_idx = t["qweight"].long(), t["qzeros"].long(), t["g_idx"].long()
    q = torch.stack([(qweight[k // per] >> (bits * (k % per))) & mask for k in range(qweight.shape[0] * per)])
    n = t["scales"].shape[1]
    z = torch.stack([(qzeros[:, j // per] >> (bits * (j % per))) & mask for j in range(n)], dim=1) + 1
    return (t["scales"].float()[g_idx] * (q - z[g_idx]).float()).t()


@pytest.mark.parametrize("bits,symmetric,group_size", [(4, True, 32), (4, False, 64), (8, True, 32), (4, False, None)])
@pytest.mark.parametrize("shuffled", [False, True])
def test_gptq_layout_with_act_order(bits, symmetric, group_size, shuffled):
    weight, decompressed, _ = compressed(bits, symmetric, group_size, False)
    groups = weight.scales.shape[1]
    order = torch.arange(groups).roll(1) if shuffled and groups > 1 else None  # never the identity
    tensors = to_gptq(weight, order)
    read = from_gptq(**tensors, bits=bits, group_size=-1 if group_size is None else group_size)
    assert (read.perm is not None) == (order is not None)
    expected = gptq_reference(tensors, bits)
    torch.testing.assert_close(read.dequantize(), expected, rtol=0, atol=0)
    # float16 scales: the same weight as compressed-tensors' to float16 rounding
    torch.testing.assert_close(read.dequantize(), decompressed, rtol=2e-3, atol=1e-6)
    # the gathered input columns give the product with the unpermuted weight
    x = torch.randn(3, weight.cols)
    torch.testing.assert_close(read.reference_linear(x, None), x @ expected.t(), rtol=1e-5, atol=1e-5)


def test_awq_layout():
    weight, decompressed, _ = compressed(4, False, 32, False)
    tensors = to_awq(weight)
    order = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's: nibble i of a word holds column order[i]
    qweight, qzeros = tensors["qweight"].long(), tensors["qzeros"].long()
    n = tensors["scales"].shape[1]
    nibble = {order[i]: i for i in range(8)}
    q = torch.stack([(qweight[:, j // 8] >> (4 * nibble[j % 8])) & 15 for j in range(n)], dim=1)
    z = torch.stack([(qzeros[:, j // 8] >> (4 * nibble[j % 8])) & 15 for j in range(n)], dim=1)
    expected = (tensors["scales"].float().repeat_interleave(32, 0) * (q - z.repeat_interleave(32, 0))).t()
    read = from_awq(**tensors, group_size=32)
    torch.testing.assert_close(read.dequantize(), expected, rtol=0, atol=0)
    torch.testing.assert_close(read.dequantize(), decompressed, rtol=2e-3, atol=1e-6)


def test_per_token_activations_match_compressed_tensors():
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    x = torch.randn(7, 96) * torch.linspace(0.1, 3, 7)[:, None]
    args = scheme(8, True, None, True).input_activations
    scale, zero = calculate_qparams(x.amin(-1, keepdim=True), x.amax(-1, keepdim=True), args)
    expected = fake_quantize(x, scale, zero, args)
    torch.testing.assert_close(quantize_activations_per_token(x), expected, rtol=0, atol=1e-7)


def test_bad_layouts_are_named():
    with pytest.raises(ValueError, match="needs scales"):
        IntWeight(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 3), None, 4, 32)
    with pytest.raises(ValueError, match="g_idx"):
        act_order(torch.tensor([0, 0, 0, 1]), 2)
