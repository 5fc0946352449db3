"""Settling the engine's configuration once (core.resolve), the one request-length check,
and the model description native runners read (model.describe)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from core.config import EngineConfig
from core.models import build_model
from core.resolve import resolve_engine
from core.sequence import ContextLengthError, check_length
from plugins import EngineConfigView, Platform
from plugins.kernels import Kernels
from plugins.model import ModelDescription
from transformers import LlamaConfig, LlamaForCausalLM

TINY = dict(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=256,
)  # fmt: skip


class Host(Platform):
    """A platform that runs bfloat16 first and overrides what it is told to."""

    name = "host"
    device_type = "cpu"
    priority = 0
    supported_dtypes = ("bfloat16", "float32")

    def __init__(self, overrides: dict | None = None) -> None:
        self.overrides = overrides or {}
        self.seen: list[EngineConfigView] = []

    def is_available(self) -> bool:
        return True

    def check_config(self, config: EngineConfigView) -> dict:
        self.seen.append(config)
        return self.overrides


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    LlamaConfig(**TINY, architectures=["LlamaForCausalLM"]).save_pretrained(path)  # resolution reads the config only
    return path


def test_resolution_fills_every_setting_from_the_platform_and_the_model(model_dir, caplog):
    platform = Host({"block_size": 32})
    config = EngineConfig(model=str(model_dir), device=platform, max_num_seqs=300, max_num_batched_tokens=100)
    with caplog.at_level("INFO"):
        resolved = resolve_engine(config)
    view = resolved.config
    assert resolved.platform is platform and view.device == "host"
    assert platform.seen[0].dtype == "auto" and platform.seen[0].max_model_len is None  # the user's settings
    assert (view.dtype, view.torch_dtype, view.max_model_len, view.block_size) == ("bfloat16", torch.bfloat16, 256, 32)
    assert view.max_num_batched_tokens == 300  # every running sequence can take a token a step
    assert "platform host sets block_size=32 (was 16)" in caplog.text
    assert (config.dtype, config.max_model_len, config.block_size) == ("auto", None, 16)  # the user's stay as given
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.dtype = "float32"


class SlowHost(Host):
    """A platform that wants small steps."""

    def default_max_num_batched_tokens(self, config: EngineConfigView) -> int:
        self.seen.append(config)
        return 96


def test_step_budget_is_the_platforms_default_unless_set(model_dir):
    platform = SlowHost()
    view = resolve_engine(EngineConfig(model=str(model_dir), device=platform, max_num_seqs=8)).config
    assert view.max_num_batched_tokens == 96 and platform.seen[-1].max_num_batched_tokens is None
    view = resolve_engine(EngineConfig(model=str(model_dir), device=platform, max_num_batched_tokens=512)).config
    assert view.max_num_batched_tokens == 512  # --max-num-batched-tokens wins
    view = resolve_engine(EngineConfig(model=str(model_dir), device=Host())).config
    assert view.max_num_batched_tokens == 2048  # the SDK's default
    with pytest.raises(ValueError, match="max_num_batched_tokens must be a positive integer"):
        resolve_engine(EngineConfig(model=str(model_dir), device=Host(), max_num_batched_tokens=0))


@pytest.mark.parametrize(
    "settings,overrides,message",
    [
        ({"dtype": "float16"}, {}, "dtype 'float16' is not supported on host; supported: bfloat16, float32"),
        ({"max_model_len": 512}, {}, "max_model_len 512 exceeds the model's limit of 256 tokens"),
        ({}, {"no_such_setting": 1}, "platform host overrides unknown engine setting 'no_such_setting'"),
        ({}, {"block_size": 0}, "block_size must be a positive integer, got 0"),
        ({"max_num_seqs": 0}, {}, "max_num_seqs must be a positive integer"),
        ({"tensor_parallel_size": 0}, {}, "tensor_parallel_size must be a positive integer, got 0"),
        ({"data_parallel_size": -1}, {}, "data_parallel_size must be a positive integer, got -1"),
        ({"distributed_executor_backend": "mpi"}, {}, "distributed_executor_backend must be one of mp, ray, got 'mpi'"),
        (
            {"quantization": "fp4"},
            {},
            "quantization must be one of int8, bf16, gguf, compressed-tensors, gptq, awq, got 'fp4'",
        ),
    ],
)
def test_resolution_names_what_cannot_work(model_dir, settings, overrides, message):
    with pytest.raises(ValueError, match=message):
        resolve_engine(EngineConfig(model=str(model_dir), device=Host(overrides), **settings))


def test_parallel_flags_long_and_short(model_dir):
    import argparse

    from core.config import add_engine_args, config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    for argv in (["-tp", "2", "-dp", "3"], ["--tensor-parallel-size", "2", "--data-parallel-size", "3"]):
        config = config_from_args(parser.parse_args([str(model_dir), *argv, "--distributed-executor-backend", "ray"]))
        assert (config.tensor_parallel_size, config.data_parallel_size) == (2, 3)
        view = resolve_engine(dataclasses.replace(config, device=Host)).config
        assert (view.world_size, view.data_parallel_size, view.distributed_executor_backend) == (2, 3, "ray")


@pytest.mark.parametrize("alias,dtype", [("float", "float32"), ("half", "float16")])
def test_vllm_dtype_spellings(model_dir, alias, dtype):
    host = Host()
    host.supported_dtypes = ("float32", "float16")
    assert resolve_engine(EngineConfig(model=str(model_dir), device=host, dtype=alias)).config.dtype == dtype
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, float16, float, half"):
        resolve_engine(EngineConfig(model=str(model_dir), device=host, dtype="double"))


def test_device_may_be_a_platform_class(model_dir):
    assert isinstance(resolve_engine(EngineConfig(model=str(model_dir), device=Host)).platform, Host)


def test_one_length_check():
    assert check_length(10, None, 16) == 6 and check_length(10, 6, 16) == 6
    assert check_length(16, 0, 16) == 0  # the scheduler's check: the prompt alone
    with pytest.raises(ContextLengthError, match="maximum context length is 16 tokens") as too_long:
        check_length(10, 7, 16)
    assert too_long.value.param == "max_tokens"
    with pytest.raises(ContextLengthError) as no_room:
        check_length(16, None, 16)  # no room for one output token
    assert no_room.value.param == "prompt"
    with pytest.raises(ValueError, match="the prompt is empty"):
        check_length(0, 1, 16)


def test_model_describes_its_weights_and_caches():
    torch.manual_seed(0)
    config = LlamaConfig(**TINY, architectures=["LlamaForCausalLM"])
    model = build_model(config, Kernels(), torch.float32, torch.device("cpu"))
    model.load_weights(LlamaForCausalLM(config).state_dict().items())
    shape = (4, 16, model.num_kv_heads, model.head_size)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(model.num_layers)]
    desc = model.describe(caches)
    assert isinstance(desc, ModelDescription) and len(desc.layers) == 2
    assert (desc.hidden_size, desc.num_heads, desc.num_kv_heads, desc.head_dim, desc.intermediate_size) == (
        32, 2, 1, 16, 48,
    )  # fmt: skip
    assert desc.vocab_size == 64 and desc.rms_norm_eps == config.rms_norm_eps and desc.attn_scale == 16**-0.5
    layer, module = desc.layers[1], model.layers[1]
    assert layer.qkv.weight is module.self_attn.qkv_proj.weight and layer.k_cache is caches[1][0]
    assert layer.down.in_features == 48 and layer.gate_up.out_features == 96
    assert desc.embedding is model.embed_tokens and desc.final_norm is model.norm.weight
    with pytest.raises(ValueError, match="one \\(k, v\\) cache per layer"):
        model.describe(caches[:1])


def test_kv_cache_dtype_resolves_once_and_unsupported_ones_name_the_platform(model_dir):
    host = Host()
    view = resolve_engine(EngineConfig(model=str(model_dir), device=host)).config
    assert (view.kv_cache_dtype, view.kv_torch_dtype) == ("bfloat16", torch.bfloat16)  # auto: the compute dtype
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8' is not supported on host; supported: auto$"):
        resolve_engine(EngineConfig(model=str(model_dir), device=host, kv_cache_dtype="fp8"))
    host.supported_kv_cache_dtypes = ("fp8_e5m2",)
    view = resolve_engine(EngineConfig(model=str(model_dir), device=host, kv_cache_dtype="fp8_e5m2")).config
    assert (view.kv_cache_dtype, view.kv_torch_dtype) == ("fp8_e5m2", torch.float8_e5m2)
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8' is not supported on host; supported: auto, fp8_e5m2"):
        resolve_engine(EngineConfig(model=str(model_dir), device=host, kv_cache_dtype="fp8"))
    host.supported_kv_cache_dtypes = ("fp8_e4m3",)
    view = resolve_engine(EngineConfig(model=str(model_dir), device=host, kv_cache_dtype="fp8")).config
    assert view.kv_cache_dtype == "fp8_e4m3"  # vLLM's fp8 is E4M3
    with pytest.raises(
        ValueError, match="kv_cache_dtype must be one of auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, got 'int8'"
    ):
        resolve_engine(EngineConfig(model=str(model_dir), device=host, kv_cache_dtype="int8"))
