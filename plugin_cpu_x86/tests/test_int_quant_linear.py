"""Native linears on quantized checkpoint weights vs compressed-tensors' own decompression.

Random weights are quantized and compressed by the ``compressed-tensors`` package, read by
the SDK (:class:`plugins.int_quant.IntWeight`), prepared by the native kernels (repacked into
INT8/Q8_0/Q4_0/Q4_1 blocks) and multiplied on every ISA path, at decode and prefill batch
sizes. The yardstick is ``x @ W.T`` with ``W`` compressed-tensors' decompressed weight and,
for W8A8, ``x`` rounded per token as compressed-tensors does (on the default path, ``x``
rounded to int16 per block where the kernel does: conftest's ``multiplied``). Tolerances: the block formats'
float16 scales (2^-11 relative; Q4_1's ``m = -scale * (zero + 8)`` likewise, on up to 15x the
scale), and W8A8's activation codes clamped to +-127 where compressed-tensors keeps -128 (the
row's most negative element, when it is the row's largest in magnitude: half a level of it).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from plugins.cpu_native.linear import QuantizedWeight
from plugins.int_quant import IntWeight, from_awq, from_compressed, from_gptq, quantize_activations_per_token
from plugins.testing.quant import compress_weight, scheme, to_awq, to_gptq

pytest.importorskip("compressed_tensors")

#: (bits, symmetric, group size or None, int8 activations) -> (native format, relative tolerance)
CASES = {
    (8, True, None, True): ("int8", 4e-3),  # W8A8: int8 rows, per-token int8 activations
    (8, True, 64, True): ("Q8_0", 4e-3),  # W8A8 in groups
    (8, True, None, False): ("int8", 2e-5),  # W8A16
    (8, True, 32, False): ("Q8_0", 1e-3),
    (4, True, 32, False): ("Q4_0", 1e-3),  # W4A16
    (4, True, None, False): ("Q4_0", 1e-3),
    (4, False, 64, False): ("Q4_1", 6e-3),  # W4A16 asymmetric
    (4, False, None, False): ("Q4_1", 6e-3),
    (8, False, 32, False): ("IntWeight", 2e-5),  # no native form: the SDK reference
}


def make(bits, symmetric, group_size, a8, rows=72, cols=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=gen) * 0.05 + 0.01
    stored, decompressed = compress_weight(weight, scheme(bits, symmetric, group_size, a8))
    acts = "int8_per_token" if a8 else None
    return from_compressed(stored, bits, group_size, "weight_packed" in stored, acts), decompressed


def expected(x: torch.Tensor, w: torch.Tensor, a8: bool) -> torch.Tensor:
    xf = quantize_activations_per_token(x.float()) if a8 else x.float()
    return F.linear(xf, w)


def assert_near(out, exact, tol, what):
    scale = exact.abs().max().item()
    torch.testing.assert_close(out.float(), exact, atol=tol * scale, rtol=0, msg=what)


@pytest.mark.parametrize(
    "case", list(CASES), ids=lambda c: f"w{c[0]}{'sym' if c[1] else 'asym'}g{c[2]}a{8 if c[3] else 16}"
)
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_checkpoint_linear_matches_decompression(kernels, multiplied, case, tokens):
    fmt, tol = CASES[case]
    weight, decompressed = make(*case)
    prepared = kernels.prepare_linear(weight, "compressed-tensors")
    assert type(prepared).__name__ == fmt or prepared.fmt == fmt
    if isinstance(prepared, QuantizedWeight):
        # W8A8 runs the int8-activation kernel, per token; the others the default path, int16
        # activations on the x8 layout where this ISA's x8 kernel is vectorized
        default_x8 = not case[3] and kernels.lib.x8_simd
        assert prepared.per_token == case[3] and prepared.act16 == default_x8
        assert prepared.interleaved == (case[3] or default_x8)
        assert_near(prepared.dequantize(), decompressed, tol, f"{fmt} weight")
    x = torch.randn(tokens, weight.cols, generator=torch.Generator().manual_seed(tokens))
    bias = torch.randn(weight.rows) * 0.1
    for dtype, extra in ((torch.float32, 0.0), (torch.bfloat16, 1.6e-2)):
        xd = x.to(dtype)
        out = kernels.linear(xd, prepared, bias.to(dtype))
        assert out.dtype == dtype and out.shape == (tokens, weight.rows)
        exact = expected(multiplied(prepared, xd), decompressed, case[3]) + bias.to(dtype).float()
        assert_near(out, exact, tol + extra, f"{fmt} {dtype} x{tokens}")


def test_w4_int8_activation_mode(kernels):
    """With CPU_QUANT_ACTIVATIONS the 4-bit groups run the int8-activation kernel (per block of 32)."""
    kernels.quantize_activations = True
    weight, decompressed = make(4, True, 32, False)
    prepared = kernels.prepare_linear(weight, "compressed-tensors")
    assert prepared.fmt == "Q4_0" and prepared.interleaved and not prepared.per_token
    x = torch.randn(9, weight.cols)
    exact = F.linear(x, decompressed)
    assert_near(kernels.linear(x, prepared), exact, 2e-2, "Q4_0 x8")


@pytest.mark.parametrize("layout", ["gptq-act-order", "awq"])
def test_legacy_layouts_on_native_kernels(kernels, layout):
    weight, decompressed = make(4, False, 32, False)
    if layout == "awq":
        read: IntWeight = from_awq(**to_awq(weight), group_size=32)
    else:
        read = from_gptq(**to_gptq(weight, torch.arange(weight.cols // 32).roll(3)), bits=4, group_size=32)
        assert read.perm is not None
    prepared = kernels.prepare_linear(read, layout.split("-")[0])
    assert prepared.fmt == "Q4_1"
    x = torch.randn(6, weight.cols)
    assert_near(kernels.linear(x, prepared), F.linear(x, decompressed), 6e-3, layout)
