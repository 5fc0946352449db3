"""``quantization_config`` validation: the schemes we run are read, every other one is refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from core.loader.quantized import CheckpointQuantization, checkpoint_quantization, gather_quantized
from plugins.errors import UnsupportedFeature
from plugins.int_quant import IntWeight


def config(qc):
    return SimpleNamespace(quantization_config=qc)


def ct(weights, inputs=None, fmt="pack-quantized", **top):
    group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs, "format": fmt}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group}, **top}


W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
W8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
A8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}


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
        (ct(W4, fmt="float-quantized"), "'float-quantized'"),
        (ct(W4, A8), "input activations"),  # W4A8
        (ct({**W8, "dynamic": True}, fmt="int-quantized"), "weights"),
        (ct(W4, sparsity_config={"format": "sparse-24"}), "sparsity_config"),
        (ct(W4, kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
        ({**ct(W4), "config_groups": {"a": ct(W4)["config_groups"]["group_0"], "b": {}}}, "one config group"),
    ],
)
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
