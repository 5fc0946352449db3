"""TPU detection, env parsing and memory-info parsing, without a TPU."""

import importlib.util

import pytest
from plugin_tpu.platform import TpuPlatform, memory_info, probe
from plugins import EnvConfigError


def test_probe_reasons():
    assert probe(False, ["/dev/accel0"], [], {}) == "torch_xla is not installed"
    assert probe(True, ["/dev/accel0"], [], {}) is None
    assert probe(True, [], ["/dev/vfio/0"], {"TPU_ACCELERATOR_TYPE": "v5litepod-4"}) is None
    assert probe(True, [], ["/dev/vfio/0"], {"PJRT_DEVICE": "tpu"}) is None
    assert "no TPU_ACCELERATOR_TYPE or PJRT_DEVICE=TPU" in probe(True, [], ["/dev/vfio/0"], {"PJRT_DEVICE": "CPU"})
    assert probe(True, [], [], {}).startswith("no TPU found: no /dev/accel* device and no /dev/vfio device")
    assert probe(True, [], [], {}, allow_cpu=True) is None
    assert probe(False, [], [], {}, allow_cpu=True) == "torch_xla is not installed"


def test_cpu_device_only_when_allowed():
    plat = TpuPlatform()
    plat.env = plat.read_env({})
    if importlib.util.find_spec("torch_xla") is not None and plat.device_info()["count"] == 0:
        assert "CORE_TPU_ALLOW_CPU=1" in plat.unavailable_reason()
    plat = TpuPlatform()
    plat.env = plat.read_env({"CORE_TPU_ALLOW_CPU": "1"})
    if importlib.util.find_spec("torch_xla") is not None:
        assert plat.is_available() and plat.on_cpu


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
    assert env["XLA_CACHE_PATH"] == "/tmp/xla" and env["TPU_BUCKET_PADDING_GAP"] == 64
    assert env["TPU_ALLOW_CPU"] is False and env["TPU_PALLAS"] is True
    with pytest.raises(EnvConfigError, match="CORE_TPU_BUCKET_PADDING_GAP"):
        plat.read_env({"CORE_TPU_BUCKET_PADDING_GAP": "wide"})


def test_identity():
    assert (TpuPlatform.name, TpuPlatform.device_type, TpuPlatform.distributed_backend) == ("tpu", "xla", "xla")
