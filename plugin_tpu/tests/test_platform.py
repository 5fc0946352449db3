"""TPU detection, env parsing, memory-info parsing and decode padding, without a TPU."""

import importlib.util

import pytest
import torch
from plugin_tpu.platform import TpuPlatform, memory_info, probe
from plugin_tpu.runner import TpuRunner
from plugins import EnvConfigError
from plugins.attention import AttentionMetadata
from plugins.runner import ModelInputs


def test_probe_reasons():
    assert probe(False, ["/dev/accel0"], [], {}) == "torch_xla is not installed"
    assert probe(True, ["/dev/accel0"], [], {}) is None
    assert probe(True, [], ["/dev/vfio/0"], {"TPU_ACCELERATOR_TYPE": "v5litepod-4"}) is None
    assert probe(True, [], ["/dev/vfio/0"], {"PJRT_DEVICE": "tpu"}) is None
    assert "no TPU_ACCELERATOR_TYPE or PJRT_DEVICE=TPU" in probe(True, [], ["/dev/vfio/0"], {"PJRT_DEVICE": "CPU"})
    assert probe(True, [], [], {}) == "no TPU found: no /dev/accel* device and no /dev/vfio device"


def test_unavailable_here_with_reason():
    plat = TpuPlatform()
    if importlib.util.find_spec("torch_xla") is None:
        assert plat.is_available() is False
        assert plat.unavailable_reason() == "torch_xla is not installed"
    assert plat.device_info()["count"] >= 0


def test_memory_info_both_spellings():
    assert memory_info({"bytes_limit": 100, "bytes_used": 30}) == (100, 70)
    assert memory_info({"kb_total": 2, "kb_free": 1}) == (2048, 1024)
    with pytest.raises(ValueError, match="unrecognised"):
        memory_info({"total": 1})


def test_env_values():
    plat = TpuPlatform()
    assert plat.read_env({})["XLA_CACHE_PATH"] == "~/.cache/core/xla_cache"
    env = plat.read_env({"VLLM_XLA_CACHE_PATH": "/tmp/xla", "CORE_TPU_BUCKET_PADDING_GAP": "64"})
    assert env == {"XLA_CACHE_PATH": "/tmp/xla", "TPU_BUCKET_PADDING_GAP": 64}
    with pytest.raises(EnvConfigError, match="CORE_TPU_BUCKET_PADDING_GAP"):
        plat.read_env({"CORE_TPU_BUCKET_PADDING_GAP": "wide"})


def test_runner_pads_decode_to_seq_sizes():
    class Config:
        max_num_seqs = 32
        max_num_batched_tokens = 512

    runner = TpuRunner(TpuPlatform())
    runner.prepare(None, [], Config())
    assert runner.seq_sizes == [8, 16, 32] and runner.token_sizes[-1] == 512
    meta = AttentionMetadata.build([1] * 9, [5] * 9, [[i] for i in range(9)], 16)
    decode = ModelInputs(torch.zeros(9, dtype=torch.int64), torch.full((9,), 4), meta)
    assert runner.padded_num_seqs(decode) == 16
    prefill_meta = AttentionMetadata.build([5], [5], [[0]], 16)
    assert runner.padded_num_seqs(ModelInputs(torch.zeros(5, dtype=torch.int64), torch.arange(5), prefill_meta)) is None


def test_identity():
    assert (TpuPlatform.name, TpuPlatform.device_type, TpuPlatform.distributed_backend) == ("tpu", "xla", "xla")
