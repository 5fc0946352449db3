"""FP8 (compressed-tensors ``float-quantized``) linears: the SDK reference vs compressed-tensors' own code.

Random weights are quantized to float8 E4M3 (a scale per tensor or channel) and compressed by
the ``compressed-tensors`` package; :func:`plugins.int_quant.from_compressed` must give back
exactly its decompression, :func:`plugins.int_quant.quantize_activations_fp8` exactly its fake
quantization of the input, and :meth:`IntWeight.reference_linear` the product as vLLM's FP8
GEMM defines it (E4M3 codes multiplied, then scaled by input scale x weight scale).
"""

from __future__ import annotations

import pytest
import torch
from plugins.int_quant import FP8, IntWeight, concat_int_weights, from_compressed, quantize_activations_fp8
from plugins.testing.quant import compress_weight, fp8_scheme

pytest.importorskip("compressed_tensors")

#: (scale per channel, else per tensor; activations)
SCHEMES = [
    (True, "fp8_per_token"),  # llm-compressor's FP8_DYNAMIC
    (False, "fp8_static"),  # its FP8
    (False, "fp8_per_token"),
    (True, "fp8_static"),
    (True, None),  # FP8 W8A16
]


def random_input(rows=7, cols=128, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen) * torch.linspace(0.05, 4, rows)[:, None]


def compressed_fp8(per_channel, activations, rows=48, cols=128, seed=0, input_scale=0.01):
    """An FP8 :class:`IntWeight` read from compressed-tensors' stored tensors, and its decompression."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=gen) * torch.linspace(0.01, 0.2, rows)[:, None]
    stored, decompressed = compress_weight(weight, fp8_scheme(per_channel, activations))
    if activations == "fp8_static":  # as calibration sets it; small enough that some inputs saturate
        stored["input_scale"] = torch.tensor([input_scale])
    return from_compressed(stored, 8, None, False, activations), decompressed, stored


@pytest.mark.parametrize("per_channel,activations", SCHEMES)
def test_float_quantized_layout_matches_its_decompression(per_channel, activations):
    weight, decompressed, stored = compressed_fp8(per_channel, activations)
    assert stored["weight"].dtype == FP8 and stored["weight_scale"].numel() == (48 if per_channel else 1)
    assert weight.codes.dtype == FP8 and torch.equal(weight.codes.view(torch.uint8), stored["weight"].view(torch.uint8))
    assert weight.scales.shape == (48, 1) and weight.zeros is None and weight.activations == activations
    assert torch.equal(weight.dequantize(), decompressed)


@pytest.mark.parametrize("static", [False, True])
def test_fp8_activations_match_compressed_tensors(static):
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    x = random_input()
    args = fp8_scheme(True, "fp8_static" if static else "fp8_per_token").input_activations
    if static:
        scale = torch.tensor([0.01])  # rows of x beyond 4.48 saturate
        assert float(x.abs().max()) > 448 * 0.01
        expected = fake_quantize(x, scale, torch.zeros_like(scale), args)
    else:
        scale, zero = calculate_qparams(x.amin(-1, keepdim=True), x.amax(-1, keepdim=True), args)
        expected = fake_quantize(x, scale, zero, args)
    ours = quantize_activations_fp8(x, scale if static else None)
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)
    assert not torch.equal(ours, x)


def scaled_fp8_product(x: torch.Tensor, weight: IntWeight) -> torch.Tensor:
    """vLLM's FP8 GEMM, written out in float64: E4M3 input codes (per token or static scale) times
    the weight's E4M3 codes, the sums scaled by input scale x weight scale."""
    if weight.activations is None:
        return (x.double() @ weight.dequantize().double().t()).float()
    if weight.activations == "fp8_static":
        x_scale = weight.input_scale.double()
    else:
        x_scale = (x.abs().amax(-1, keepdim=True) / 448).double()
    x_codes = (x.double() / x_scale).clamp(-448, 448).float().to(FP8)
    sums = x_codes.double() @ weight.codes.double().t()
    return (sums * x_scale * weight.scales.double().t()).float()


@pytest.mark.parametrize("per_channel,activations", SCHEMES)
def test_reference_linear_is_the_scaled_fp8_product(per_channel, activations):
    weight, _, _ = compressed_fp8(per_channel, activations)
    x, bias = random_input(), torch.randn(48)
    expected = scaled_fp8_product(x, weight) + bias
    torch.testing.assert_close(weight.reference_linear(x, bias), expected, rtol=1e-5, atol=1e-5)
    # bf16 activations: the same float32 computation, rounded once at the end
    bf16 = weight.reference_linear(x.bfloat16(), bias.bfloat16())
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), scaled_fp8_product(x.bfloat16().float(), weight) + bias.bfloat16().float(),
                               rtol=1e-2, atol=1e-2)  # fmt: skip


@pytest.mark.parametrize("activations", ["fp8_per_token", "fp8_static"])
def test_fused_rows_give_the_parts_outputs(activations):
    """q/k/v with per-tensor scales fused into one linear: each row keeps its part's scale."""
    parts = [compressed_fp8(False, activations, rows=r, seed=s)[0] for r, s in ((32, 1), (16, 2), (16, 3))]
    assert len({float(p.scales[0, 0]) for p in parts}) == 3
    fused = concat_int_weights(parts)
    x = random_input()
    torch.testing.assert_close(
        fused.reference_linear(x, None), torch.cat([p.reference_linear(x, None) for p in parts], 1)
    )


def test_fused_static_input_scales_take_the_largest():
    parts = [compressed_fp8(False, "fp8_static", input_scale=s)[0] for s in (0.01, 0.03)]
    assert float(concat_int_weights(parts).input_scale) == pytest.approx(0.03)


def test_bad_fp8_weights_are_named():
    codes, scales = torch.zeros(4, 64, dtype=FP8), torch.ones(4, 1)
    with pytest.raises(ValueError, match="'fp8_per_token' with torch.int8 codes"):
        IntWeight(torch.zeros(4, 64, dtype=torch.int8), scales, None, 8, 64, activations="fp8_per_token")
    with pytest.raises(ValueError, match="'int8_per_token' with torch.float8_e4m3fn codes"):
        IntWeight(codes, scales, None, 8, 64, activations="int8_per_token")
    with pytest.raises(ValueError, match="input_scale goes with"):
        IntWeight(codes, scales, None, 8, 64, activations="fp8_static")
    with pytest.raises(ValueError, match="one scale per row"):
        IntWeight(codes, torch.ones(4, 2), None, 8, 32, activations="fp8_per_token")
    with pytest.raises(ValueError, match="different schemes"):
        concat_int_weights(
            [IntWeight(codes, scales, None, 8, 64), IntWeight(codes.view(torch.int8), scales, None, 8, 64)]
        )
