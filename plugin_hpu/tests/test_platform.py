"""Gaudi detection, env parsing and config checks, without a Gaudi."""

import importlib.util

import pytest
from plugin_hpu.platform import HpuPlatform, probe
from plugins import EnvConfigError


def test_probe_reasons():
    assert probe(False, ["/dev/accel/accel0"]) == "habana_frameworks is not installed (Intel Gaudi software stack)"
    assert probe(True, []) == "no Gaudi device found (/dev/accel/accel* or /dev/hl*)"
    assert probe(True, ["/dev/accel/accel0"]) is None


def test_unavailable_here_with_reason():
    plat = HpuPlatform()
    if importlib.util.find_spec("habana_frameworks") is None:
        assert plat.is_available() is False
        assert plat.unavailable_reason() == "habana_frameworks is not installed (Intel Gaudi software stack)"
    assert isinstance(plat.device_info()["count"], int)


def test_env_defaults_are_vllms():
    env = HpuPlatform().read_env({})
    assert env["SKIP_WARMUP"] is False
    assert env["GRAPH_RESERVED_MEM"] == 0.1 and env["GRAPH_PROMPT_RATIO"] == 0.3
    assert env["GRAPH_PROMPT_STRATEGY"] == "min_tokens" and env["GRAPH_DECODE_STRATEGY"] == "max_bs"
    assert env["PROMPT_BS_BUCKET_MIN"] is None and env["DECODE_BLOCK_BUCKET_MAX"] is None
    assert len([name for name in env if "_BUCKET_" in name]) == 12


def test_env_vllm_spellings_and_bad_values():
    plat = HpuPlatform()
    env = plat.read_env(
        {"VLLM_SKIP_WARMUP": "true", "VLLM_PROMPT_SEQ_BUCKET_MAX": "2048", "VLLM_GRAPH_PROMPT_RATIO": "0.2"}
    )
    assert env["SKIP_WARMUP"] is True and env["PROMPT_SEQ_BUCKET_MAX"] == 2048 and env["GRAPH_PROMPT_RATIO"] == 0.2
    with pytest.raises(EnvConfigError, match="CORE_GRAPH_RESERVED_MEM='1.5'"):
        plat.read_env({"CORE_GRAPH_RESERVED_MEM": "1.5"})
    with pytest.raises(EnvConfigError, match="VLLM_GRAPH_DECODE_STRATEGY='fastest' is not one of: min_tokens, max_bs"):
        plat.read_env({"VLLM_GRAPH_DECODE_STRATEGY": "fastest"})
    with pytest.raises(EnvConfigError, match="CORE_DECODE_BS_BUCKET_STEP"):
        plat.read_env({"CORE_DECODE_BS_BUCKET_STEP": "32.5"})


def test_check_config():
    class Config:
        dtype = "auto"
        block_size = 128
        enable_chunked_prefill = True

    assert HpuPlatform().check_config(Config()) == {"enable_chunked_prefill": False}
    Config.dtype = "float16"
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        HpuPlatform().check_config(Config())


def test_identity():
    assert (HpuPlatform.name, HpuPlatform.device_type, HpuPlatform.distributed_backend) == ("hpu", "hpu", "hccl")
