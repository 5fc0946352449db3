"""``quantization_config`` validation: the schemes we run are read, every other one is refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from core.loader.quantized import CheckpointQuantization, checkpoint_quantization, gather_quantized
from plugins.errors import UnsupportedFeature
from plugins.int_quant import FP8, IntWeight


def config(qc):
    return SimpleNamespace(quantization_config=qc)


def ct(weights, inputs=None, fmt="pack-quantized", **top):
    group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs, "format": fmt}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group}, **top}


W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
W8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
A8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
#: llm-compressor's FP8_DYNAMIC (channel weights, per-token activations) and FP8 (tensor, static)
FP8_W = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
FP8_TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
FP8_STATIC = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
FP8_SCHEME = CheckpointQuantization("compressed-tensors", 8, None, False, "fp8_per_token", fp8=True)


@pytest.mark.parametrize(
    "qc,expected",
    [
        (ct(W4), CheckpointQuantization("compressed-tensors", 4, 32, True, None)),
        (ct(W8, A8, "int-quantized"), CheckpointQuantization("compressed-tensors", 8, None, False, "int8_per_token")),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True},
         CheckpointQuantization("gptq", 4, 128, True, None)),
        ({"quant_method": "gptq", "bits": 8, "group_size": -1}, CheckpointQuantization("gptq", 8, None, True, None)),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "GEMM"},
         CheckpointQuantization("awq", 4, 128, True, None)),
        (ct(FP8_W, FP8_TOKEN, "float-quantized"), FP8_SCHEME),
        (ct({**FP8_W, "strategy": "tensor"}, FP8_STATIC, "float-quantized"),
         CheckpointQuantization("compressed-tensors", 8, None, False, "fp8_static", fp8=True)),
        (ct(FP8_W, FP8_TOKEN, "naive-quantized"), FP8_SCHEME),
        (ct(FP8_W, None, "float-quantized"), CheckpointQuantization("compressed-tensors", 8, None, False, None, fp8=True)),
    ],
)  # fmt: skip
def test_supported_schemes(qc, expected):
    assert checkpoint_quantization(config(qc), None) == expected
    assert checkpoint_quantization(config(qc), expected.method) == expected


@pytest.mark.parametrize(
    "qc,message",
    [
        ({"quant_method": "fp8"}, "method 'fp8' is not supported"),
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "3-bit"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}, "'gptq_v2'"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "'gemv'"),
        (ct(W4, fmt="float-quantized"), "'float-quantized' with int weights"),
        (ct({**FP8_W, "strategy": "block", "block_structure": [128, 128]}, FP8_TOKEN, "float-quantized"),
         r"FP8 block-wise weight scales \(strategy 'block', block_structure \[128, 128\]\)"),
        (ct({**FP8_W, "strategy": "group", "group_size": 128}, FP8_TOKEN, "float-quantized"), "strategy tensor or channel"),
        (ct({**FP8_W, "symmetric": False}, FP8_TOKEN, "float-quantized"), "float weights"),
        (ct({**FP8_W, "num_bits": 4}, None, "float-quantized"), "float weights"),
        (ct(FP8_W, {**FP8_TOKEN, "strategy": "group", "group_size": 128}, "float-quantized"), "FP8 input activations"),
        (ct(FP8_W, {**FP8_STATIC, "dynamic": "local"}, "float-quantized"), "FP8 input activations"),
        (ct(FP8_W, A8, "float-quantized"), "FP8 input activations"),  # int8 activations with FP8 weights
        (ct(FP8_W, FP8_TOKEN, "float-quantized", kv_cache_scheme={"num_bits": 8, "type": "float"}), "kv_cache_scheme"),
        (ct(W4, A8), "input activations"),  # W4A8
        (ct({**W8, "dynamic": True}, fmt="int-quantized"), "weights"),
        (ct(W4, sparsity_config={"format": "sparse-24"}), "sparsity_config"),
        (ct(W4, kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
        ({**ct(W4), "config_groups": {"a": ct(W4)["config_groups"]["group_0"], "b": {}}}, "one config group"),
    ],
)  # fmt: skip
def test_unsupported_schemes_are_named(qc, message):
    with pytest.raises(UnsupportedFeature, match=message):
        checkpoint_quantization(config(qc), None)


def test_flag_and_checkpoint_must_agree():
    assert checkpoint_quantization(config(None), None) is None
    assert checkpoint_quantization(config(None), "int8") is None
    with pytest.raises(ValueError, match="no quantization_config"):
        checkpoint_quantization(config(None), "awq")
    with pytest.raises(ValueError, match="'gptq' requested, but the checkpoint is quantized with 'compressed-tensors'"):
        checkpoint_quantization(config(ct(W4)), "gptq")


def test_gather_names_a_missing_part():
    scheme = CheckpointQuantization("compressed-tensors", 4, 32, True, None)
    parts = [("model.layers.0.mlp.up_proj.weight_packed", torch.zeros(8, 8, dtype=torch.int32)),
             ("model.norm.weight", torch.ones(4))]  # fmt: skip
    gathered = gather_quantized(iter(parts), scheme, torch.device("cpu"))
    assert next(gathered)[0] == "model.norm.weight"
    with pytest.raises(ValueError, match="'model.layers.0.mlp.up_proj' lacks its 'weight_scale' tensor"):
        next(gathered)


def test_gather_keeps_int8_weights_as_stored():
    scheme = CheckpointQuantization("compressed-tensors", 8, None, False, "int8_per_token")
    codes = torch.randint(-128, 128, (4, 64), dtype=torch.int8)
    parts = [("m.q_proj.weight", codes), ("m.q_proj.weight_scale", torch.rand(4, 1))]
    [(name, weight)] = list(gather_quantized(iter(parts), scheme, torch.device("cpu")))
    assert name == "m.q_proj.weight" and isinstance(weight, IntWeight)
    assert torch.equal(weight.codes, codes) and weight.activations == "int8_per_token"


@pytest.mark.parametrize("static", [False, True])
def test_gather_keeps_fp8_weights_as_stored(static):
    scheme = CheckpointQuantization("compressed-tensors", 8, None, False, "fp8_static" if static else "fp8_per_token",
                                    fp8=True)  # fmt: skip
    codes = (torch.randn(4, 64) * 100).to(FP8)
    parts = [("m.q_proj.weight", codes), ("m.q_proj.weight_scale", torch.tensor([0.5]))]
    parts += [("m.q_proj.input_scale", torch.tensor([0.25]))] if static else []
    [(name, weight)] = list(gather_quantized(iter(parts), scheme, torch.device("cpu")))
    assert (
        name == "m.q_proj.weight" and weight.codes.dtype == FP8 and torch.equal(weight.scales, torch.full((4, 1), 0.5))
    )
    assert torch.equal(weight.codes.view(torch.uint8), codes.view(torch.uint8))
    assert (weight.input_scale is not None) == static


def test_gather_names_stored_codes_of_another_kind():
    fp8 = CheckpointQuantization("compressed-tensors", 8, None, False, "fp8_per_token", fp8=True)
    parts = [("m.q_proj.weight", torch.zeros(4, 64, dtype=torch.int8)), ("m.q_proj.weight_scale", torch.ones(4, 1))]
    with pytest.raises(ValueError, match="activations 'fp8_per_token' with torch.int8 codes"):
        list(gather_quantized(iter(parts), fp8, torch.device("cpu")))
    w8a16 = CheckpointQuantization("compressed-tensors", 8, None, False, None, fp8=True)
    with pytest.raises(
        ValueError, match="'m.q_proj' stores torch.int8 codes, not those of compressed-tensors FP8 W8A16"
    ):
        list(gather_quantized(iter(parts), w8a16, torch.device("cpu")))
    static = CheckpointQuantization("compressed-tensors", 8, None, False, "fp8_static", fp8=True)
    parts = [("m.q_proj.weight", torch.zeros(4, 64, dtype=FP8)), ("m.q_proj.weight_scale", torch.ones(1))]
    with pytest.raises(ValueError, match="'m.q_proj' lacks its 'input_scale' tensor"):
        list(gather_quantized(iter(parts), static, torch.device("cpu")))
