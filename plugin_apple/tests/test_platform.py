"""Apple silicon detection, dtype honesty and env mirroring, off a Mac."""

import os
import platform

import plugins
import pytest
from plugin_apple.platform import ApplePlatform, parse_version, probe, torch_mps_available
from plugins import EnvConfigError


def test_probe_reasons():
    assert probe("Linux", "x86_64", (), True, None).startswith("not macOS (this is Linux)")
    assert probe("Darwin", "x86_64", (13, 0), True, None) == "macOS on x86_64: MPS needs Apple silicon (arm64)"
    assert probe("Darwin", "arm64", (12, 2), True, None) == "macOS 12.2: MPS needs macOS 12.3 or later"
    assert probe("Darwin", "arm64", (14, 5), False, None) == "torch is not installed"
    assert "is_available() is False" in probe("Darwin", "arm64", (14, 5), True, False)
    assert probe("Darwin", "arm64", (14, 5), True, None) is None  # torch not imported: the wheel ships MPS
    assert probe("Darwin", "arm64", (12, 3), True, True) is None


def test_parse_version():
    assert parse_version("14.5.1") == (14, 5, 1)
    assert parse_version("") == ()


def test_torch_answer_only_when_already_imported():
    import torch

    assert torch_mps_available() == torch.backends.mps.is_available()


def test_this_machine_never_raises():
    plat = ApplePlatform()
    if platform.system() != "Darwin":
        assert plat.is_available() is False
        assert plat.unavailable_reason().startswith(f"not macOS (this is {platform.system()})")
        assert plat.device_info()["bfloat16"] is False


def test_bfloat16_follows_the_macos_version(monkeypatch):
    class Config:
        dtype = "bfloat16"

    monkeypatch.setattr(platform, "mac_ver", lambda: ("13.6", ("", "", ""), "arm64"))
    assert ApplePlatform().supported_dtypes == ("float16", "float32")
    with pytest.raises(ValueError, match="bfloat16 on MPS needs macOS 14.0 or later, this is macOS 13.6"):
        ApplePlatform().check_config(Config())
    monkeypatch.setattr(platform, "mac_ver", lambda: ("14.2", ("", "", ""), "arm64"))
    assert ApplePlatform().supported_dtypes == ("float16", "float32", "bfloat16")
    assert ApplePlatform().check_config(Config()) == {}


def test_env_values():
    plat = ApplePlatform()
    env = plat.read_env({"CORE_APPLE_MPS_HIGH_WATERMARK_RATIO": "0.0", "VLLM_APPLE_MPS_FALLBACK": "yes"})
    assert env["APPLE_MPS_HIGH_WATERMARK_RATIO"] == 0.0 and env["APPLE_MPS_FALLBACK"] is True
    with pytest.raises(EnvConfigError, match="CORE_APPLE_MPS_HIGH_WATERMARK_RATIO='3'"):
        plat.read_env({"CORE_APPLE_MPS_HIGH_WATERMARK_RATIO": "3"})


def test_init_device_mirrors_variables_before_mps_starts(monkeypatch):
    monkeypatch.setenv("CORE_APPLE_MPS_HIGH_WATERMARK_RATIO", "1.3")
    monkeypatch.setenv("CORE_APPLE_MPS_FALLBACK", "1")
    monkeypatch.delenv("PYTORCH_MPS_HIGH_WATERMARK_RATIO", raising=False)
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    plat = ApplePlatform()
    try:
        plat.init_device(None)
    except plugins.PlatformUnavailable as exc:  # no Metal device here: set-up still ran first
        assert "is_available() is False" in str(exc)
    assert os.environ["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] == "1.3"
    assert os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] == "1"


def test_identity():
    assert (ApplePlatform.name, ApplePlatform.device_type, ApplePlatform.priority) == ("apple", "mps", 50)
