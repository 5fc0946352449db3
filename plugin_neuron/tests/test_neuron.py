"""Neuron detection, buckets and env parsing, without a Neuron device."""

import importlib.util

import pytest
import torch
from plugin_neuron.buckets import check_buckets, default_buckets, select_bucket
from plugin_neuron.platform import NeuronPlatform, probe
from plugin_neuron.runner import NeuronRunner
from plugins import EnvConfigError
from plugins.attention import AttentionMetadata
from plugins.reference import engine_config
from plugins.runner import ModelInputs


def test_probe_reasons():
    assert probe(False, ["/dev/neuron0"]) == "torch_neuronx is not installed (AWS Neuron SDK)"
    assert probe(True, []).startswith("no Neuron device found (/dev/neuron*)")
    assert probe(True, ["/dev/neuron0"]) is None


def test_unavailable_here_with_reason():
    plat = NeuronPlatform()
    if importlib.util.find_spec("torch_neuronx") is None:
        assert plat.is_available() is False
        assert plat.unavailable_reason() == "torch_neuronx is not installed (AWS Neuron SDK)"
    assert plat.device_info()["count"] >= 0


def test_default_buckets_follow_nxd_inference():
    # "powers of two between 128 and the max context length", the maximum always last
    assert default_buckets(2048) == [128, 256, 512, 1024, 2048]
    assert default_buckets(3000) == [128, 256, 512, 1024, 2048, 3000]
    # NxD Inference rounds log2(max): no [128, 256, 512, 513], and 2048 is dropped below 2048 * sqrt(2)
    assert default_buckets(513) == [128, 256, 513]
    assert default_buckets(2500) == [128, 256, 512, 1024, 2500] and default_buckets(2897) == [
        128,
        256,
        512,
        1024,
        2048,
        2897,
    ]
    assert default_buckets(128) == [128] and default_buckets(100) == [100]


def test_check_and_select():
    assert check_buckets((128, 512, 1024), 1024, "X") == [128, 512, 1024]
    with pytest.raises(ValueError, match=r"X=\[512, 128\] must be strictly ascending"):
        check_buckets((512, 128), 128, "X")
    with pytest.raises(ValueError, match="ends below max_model_len=4096: add 4096"):
        check_buckets((128, 1024), 4096, "X")
    assert select_bucket(129, [128, 512]) == 512
    with pytest.raises(ValueError, match="exceeds the largest compiled bucket 512"):
        select_bucket(513, [128, 512])


def test_env_lists_good_and_bad(monkeypatch):
    plat = NeuronPlatform()
    env = plat.read_env({"VLLM_NEURON_CONTEXT_LENGTH_BUCKETS": "128, 512,1024"})
    assert env["NEURON_CONTEXT_LENGTH_BUCKETS"] == (128, 512, 1024) and env["NEURON_TOKEN_GEN_BUCKETS"] is None
    with pytest.raises(EnvConfigError, match="CORE_NEURON_TOKEN_GEN_BUCKETS='128,big'"):
        plat.read_env({"CORE_NEURON_TOKEN_GEN_BUCKETS": "128,big"})
    monkeypatch.setenv("CORE_NEURON_TOKEN_GEN_BUCKETS", "256,128")
    with pytest.raises(ValueError, match="NEURON_TOKEN_GEN_BUCKETS=.* strictly ascending"):
        NeuronPlatform().length_buckets(256)


def test_check_config():
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        NeuronPlatform().check_config(engine_config(dtype="float32", max_model_len=1024))
    # prompts are encoded whole: chunked prefill is turned off
    assert NeuronPlatform().check_config(engine_config(dtype="bfloat16")) == {"enable_chunked_prefill": False}
    assert NeuronPlatform().check_config(engine_config(dtype="bfloat16", enable_chunked_prefill=False)) == {}


def test_runner_pads_decode_to_compiled_batch():
    runner = NeuronRunner(NeuronPlatform())
    runner.prepare(None, [], engine_config(max_num_seqs=8, max_model_len=256))
    meta = AttentionMetadata.build([1] * 3, [4] * 3, [[0], [1], [2]], 16)
    assert runner.padded_num_seqs(ModelInputs(torch.zeros(3, dtype=torch.int64), torch.full((3,), 3), meta)) == 8


def test_identity():
    assert (NeuronPlatform.name, NeuronPlatform.device_type, NeuronPlatform.priority) == ("neuron", "neuron", 80)
