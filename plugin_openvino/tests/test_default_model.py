"""LLM(device="openvino") on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF): cpu_x86's greedy tokens."""

import logging

import pytest

from core import LLM, SamplingParams

PROMPTS = [
    "Hello, my name is",
    "The capital of France is",
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light into "
    "chemical energy. In the chloroplasts, chlorophyll absorbs",
]


def _greedy(device: str) -> list[list[int]]:
    llm = LLM(device=device, max_model_len=256, kv_cache_bytes=32 << 20)
    # the second and third prompts again: prefix-cache hits beside decodes
    outs = llm.generate(PROMPTS + PROMPTS[1:], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["", "u8"])
def test_greedy_tokens_equal_cpu_x86(caplog, monkeypatch, precision):
    """The KV cache in the compute dtype, and in OpenVINO's u8 blocks (3.4x the blocks of float32)."""
    pytest.importorskip("plugin_cpu_x86")
    monkeypatch.setenv("CORE_OPENVINO_CPU_KV_CACHE_PRECISION", precision)
    with caplog.at_level(logging.INFO, logger="plugin_openvino.runner"):
        openvino = _greedy("openvino")
    assert "each step as one compiled OpenVINO model" in caplog.text, caplog.text
    assert ("KV cache u8" in caplog.text) == (precision == "u8"), caplog.text
    assert openvino == _greedy("cpu_x86")
