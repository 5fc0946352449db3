"""GGUF blocks as OpenVINO compressed-weight products against the SDK's dequantization."""

import numpy as np
import pytest
import torch
from plugin_openvino.weights import matmul_node
from plugins.reference import random_gguf_weight

ov = pytest.importorskip("openvino")


def _product(weight, x: torch.Tensor, q4_1: str = "f16", group_size: int = 0) -> torch.Tensor:
    import openvino.opset13 as ops

    keep: list[torch.Tensor] = []
    param = ops.parameter([-1, weight.cols], ov.Type.f32, name="x")
    model = ov.Model([ops.result(matmul_node(param, weight, keep, True, q4_1))], [param])
    compiled = ov.Core().compile_model(
        model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": group_size}
    )
    return torch.from_numpy(compiled({"x": x.numpy()})[0].copy())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_compressed_products_match_the_dequantized_weights(qtype):
    weight = random_gguf_weight(qtype, 48, 128, seed=1)
    x = torch.randn(5, 128)
    want = x @ weight.dequantize().T
    torch.testing.assert_close(_product(weight, x), want, rtol=2e-3, atol=2e-3 * float(want.abs().max()))


def test_rounded_q4_1_zero_points_are_genai_s_model():
    """Zero points round(-m/d) in 0..15: each weight is d * (q - round(-m/d)), not d * q + m."""
    weight = random_gguf_weight("Q4_1", 32, 64, seed=2)
    data = weight.data.reshape(32, 2, 20)
    d = data[..., 0:2].contiguous().view(torch.float16).float()
    m = data[..., 2:4].contiguous().view(torch.float16).float()
    zero = torch.where(d == 0, 0.0, -m / d).round().clamp(0, 15)
    codes = torch.cat([data[..., 4:] & 0x0F, data[..., 4:] >> 4], dim=-1).float()  # [rows, blocks, 32]
    genai = torch.where(d == 0, m, d * (codes - zero)).reshape(32, 64)
    x = torch.randn(3, 64)
    got = _product(weight, x, "round")
    torch.testing.assert_close(got, x @ genai.T, rtol=2e-3, atol=2e-3 * float(got.abs().max()))
    assert not np.allclose(got.numpy(), (x @ weight.dequantize().T).numpy(), rtol=1e-2, atol=1e-2)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


def test_split_q4_1_is_the_file_s_exact_model():
    """d * q (no zero point) plus blocksums(x) @ m.T: float32 rounding only, where f16 zero points
    are within 2^-11 of a step (a block with d == 0 included: its minimums carry it)."""
    weight = random_gguf_weight("Q4_1", 64, 256, seed=3)
    weight.data.reshape(64, 8, 20)[5, 2, 0:2] = 0  # one block of d == 0: every weight m
    x = torch.randn(4, 256)
    want = x.double() @ weight.dequantize().double().T
    split, f16 = _relative_error(_product(weight, x, "split"), want), _relative_error(_product(weight, x), want)
    assert split < 1e-6 < f16, (split, f16)


def test_split_q4_1_under_int8_activations():
    """Int8 activations quantize x (in groups of 32), not the weights: close to the exact product."""
    weight = random_gguf_weight("Q4_1", 64, 256, seed=4)
    x = torch.randn(4, 256)
    want = x.double() @ weight.dequantize().double().T
    assert _relative_error(_product(weight, x, "split", group_size=32), want) < 2e-2


def test_unknown_q4_1_form_is_refused():
    import openvino.opset13 as ops

    param = ops.parameter([-1, 64], ov.Type.f32, name="x")
    with pytest.raises(ValueError, match="Q4_1 form 'exact'"):
        matmul_node(param, random_gguf_weight("Q4_1", 8, 64, seed=5), [], True, "exact")
