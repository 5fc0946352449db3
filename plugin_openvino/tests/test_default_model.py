"""LLM(device="openvino") on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF): cpu_x86's greedy tokens."""

import logging

import numpy as np
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


def test_logit_rows():
    """The last row of each prompt chunk; every row of a short continuation (a speculative step)."""
    from plugin_openvino.runner import SPECULATIVE_ROWS, logit_rows

    def rows(query_lens, seq_lens):
        return logit_rows(np.array(query_lens, np.int32), np.array(seq_lens, np.int32)).tolist()

    assert rows([1, 1, 1], [5, 9, 2]) == [0, 1, 2]  # decode
    assert rows([7], [7]) == [6]  # a fresh prompt
    assert rows([5, 3, 10, 1], [5, 9, 30, 2]) == [4, 5, 6, 7, 17, 18]  # a prompt, drafts, a chunk, a decode
    n = SPECULATIVE_ROWS + 1
    assert rows([n], [n + 4]) == [n - 1]  # a longer continuation: a prompt's chunk


COPY = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "


@pytest.mark.slow
def test_speculative_steps_and_prompt_logprobs():
    """n-gram speculation on openvino: the tokens of the plain engine, drafts accepted (the graph's
    logits of every draft row); prompt logprobs (the LM head's own compiled model, rows the graph
    did not compute) within 0.1 of cpu_x86's (its kernels' products differ by up to ~0.05 here; a
    logit of the wrong row is off by units)."""
    pytest.importorskip("plugin_cpu_x86")
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    params = SamplingParams(temperature=0.0, max_tokens=32)
    outs = {}
    for name, kw in (("plain", {}), ("spec", {"speculative_config": ngram})):
        llm = LLM(device="openvino", max_model_len=256, kv_cache_bytes=32 << 20, **kw)
        outs[name] = llm.generate([COPY], params, use_tqdm=False)[0].outputs[0].token_ids
        if name == "spec":
            assert llm.engine.spec.stats()["num_accepted_tokens"] >= 4
        llm.shutdown()
    assert outs["spec"] == outs["plain"]
    logprobs = {}
    for device in ("openvino", "cpu_x86"):
        llm = LLM(device=device, max_model_len=256, kv_cache_bytes=32 << 20)
        out = llm.generate([COPY], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        logprobs[device] = [next(iter(d.values())).logprob for d in out[0].prompt_logprobs[1:]]
        llm.shutdown()
    assert len(logprobs["openvino"]) > 20
    np.testing.assert_allclose(logprobs["openvino"], logprobs["cpu_x86"], atol=0.1)
