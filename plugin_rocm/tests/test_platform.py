"""ROCm detection from torch/version.py text and a fake KFD topology; memory rule."""

import os

import pytest
from plugin_rocm.platform import (
    RocmPlatform,
    installed_torch_version_py,
    kfd_gpus,
    probe,
    torch_hip_version,
)
from plugins import EnvConfigError
from plugins.memory import GiB
from plugins.memory import gpu_kv_budget as kv_budget

CPU_BUILD = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"
ROCM_BUILD = "__version__ = '2.5.1+rocm6.2'\ncuda: Optional[str] = None\nhip: Optional[str] = '6.2.41133-dd7f95766'\n"
OLD_ROCM_BUILD = "__version__ = '1.13.1+rocm5.2'\ncuda = None\nhip = '5.2.21151-afdc89f8'\n"


def test_hip_version_from_text():
    assert torch_hip_version(CPU_BUILD) is None
    assert torch_hip_version(ROCM_BUILD) == "6.2.41133-dd7f95766"
    assert torch_hip_version(OLD_ROCM_BUILD) == "5.2.21151-afdc89f8"
    assert torch_hip_version("") is None


def write_node(root, index, props, name="", banks=()):
    node = root / str(index)
    node.mkdir(parents=True)
    (node / "properties").write_text("".join(f"{k} {v}\n" for k, v in props.items()))
    (node / "name").write_text(name + "\n")
    for i, size in enumerate(banks):
        (node / "mem_banks" / str(i)).mkdir(parents=True)
        (node / "mem_banks" / str(i) / "properties").write_text(f"heap_type 1\nsize_in_bytes {size}\n")


def test_kfd_topology(tmp_path):
    write_node(tmp_path, 0, {"cpu_cores_count": 64, "simd_count": 0})
    write_node(tmp_path, 1, {"simd_count": 1216, "gfx_target_version": 90402}, "", [192 * GiB])
    write_node(tmp_path, 2, {"simd_count": 440, "gfx_target_version": 90010}, "aldebaran", [64 * GiB])
    gpus = kfd_gpus(str(tmp_path))
    assert gpus == [
        {"name": "gfx942", "gfx": "gfx942", "memory_gib": 192.0},
        {"name": "aldebaran", "gfx": "gfx90a", "memory_gib": 64.0},
    ]
    assert kfd_gpus(str(tmp_path / "missing")) == []


def test_probe_reasons():
    assert probe(None, False, True, 1) == "torch is not installed"
    assert probe(None, True, True, 1) == "torch is not a ROCm (HIP) build: torch.version.hip is None"
    assert probe("6.2", True, False, 0).startswith("no ROCm kernel driver: /dev/kfd is missing")
    assert probe("6.2", True, True, 0) == "/dev/kfd present but the KFD topology lists no GPU"
    assert probe("6.2", True, True, 2) is None


def test_this_machine_never_raises():
    plat = RocmPlatform()
    if torch_hip_version(installed_torch_version_py()) is None:
        assert plat.is_available() is False
        assert plat.unavailable_reason() == "torch is not a ROCm (HIP) build: torch.version.hip is None"
    elif not os.path.exists("/dev/kfd"):
        assert "/dev/kfd is missing" in plat.unavailable_reason()
    assert plat.device_info()["count"] >= 0


def test_kv_budget_rule():
    # 64 GiB card, 20 GiB in use (weights), 2 GiB peak activations, 90% utilization
    assert kv_budget(64 * GiB, 44 * GiB, 2 * GiB, 0.9) == int(64 * GiB * 0.9) - 22 * GiB
    assert kv_budget(64 * GiB, 4 * GiB, 0, 0.5) == 0


def test_env_values():
    plat = RocmPlatform()
    assert plat.read_env({"VLLM_ROCM_GPU_MEMORY_UTILIZATION": "0.8"})["ROCM_GPU_MEMORY_UTILIZATION"] == 0.8
    assert plat.read_env({})["ROCM_GPU_MEMORY_UTILIZATION"] is None
    for bad in ("0", "1.2", "most"):
        with pytest.raises(EnvConfigError, match="CORE_ROCM_GPU_MEMORY_UTILIZATION"):
            plat.read_env({"CORE_ROCM_GPU_MEMORY_UTILIZATION": bad})


def test_identity():
    assert (RocmPlatform.name, RocmPlatform.device_type, RocmPlatform.priority) == ("rocm", "cuda", 100)
