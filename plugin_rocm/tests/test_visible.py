"""ROCm's GPU visibility variables and the memory utilisation setting, without a GPU."""

import pytest
from plugin_rocm.platform import RocmMemoryProfiler, RocmPlatform
from plugin_rocm.visible import device_env, parse_devices, visible_count
from plugins.memory import GiB
from plugins.reference import engine_config


def test_engine_spelling_is_exported_for_hip_and_torch():
    assert device_env("0,2", {}) == {"HIP_VISIBLE_DEVICES": "0,2", "CUDA_VISIBLE_DEVICES": "0,2"}
    assert device_env(None, {"HIP_VISIBLE_DEVICES": "1"}) == {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"}
    assert device_env(None, {}) == {}
    assert device_env("1", {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"})["HIP_VISIBLE_DEVICES"] == "1"


def test_conflicts_and_bad_lists_are_named():
    with pytest.raises(ValueError, match="ROCM_VISIBLE_DEVICES='0' conflicts with HIP_VISIBLE_DEVICES='1'"):
        device_env("0", {"HIP_VISIBLE_DEVICES": "1"})
    with pytest.raises(ValueError, match="HIP_VISIBLE_DEVICES='0,1' and CUDA_VISIBLE_DEVICES='0' differ"):
        device_env(None, {"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(ValueError, match="'gpu1' is not a device index"):
        device_env("0,gpu1", {})
    with pytest.raises(ValueError, match="lists a device twice"):
        parse_devices("1,1", "HIP_VISIBLE_DEVICES")


def test_two_layers_of_visibility():
    assert visible_count(8, {}) == 8
    assert visible_count(8, {"ROCR_VISIBLE_DEVICES": "0,1,2,3"}) == 4
    # HIP indexes the list ROCR left
    assert visible_count(8, {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "0,3"}) == 2
    assert visible_count(8, {"ROCR_VISIBLE_DEVICES": "GPU-4b2c1e0f7a9d3c21,3"}) == 2
    with pytest.raises(ValueError, match="HIP_VISIBLE_DEVICES='5' names GPU 5, but only 4 are visible to it"):
        visible_count(8, {"ROCR_VISIBLE_DEVICES": "0,1,2,3", "HIP_VISIBLE_DEVICES": "5"})
    with pytest.raises(ValueError, match="HIP_VISIBLE_DEVICES='GPU-1'"):
        visible_count(8, {"HIP_VISIBLE_DEVICES": "GPU-1"})  # uuids are ROCR's only


class MI300X:
    """A 192 GiB MI300X as torch.cuda's memory API reports it: 40 GiB in use."""

    @staticmethod
    def mem_get_info() -> tuple[int, int]:
        return 152 * GiB, 192 * GiB


def test_memory_utilisation_variable_overrides_the_engine_flag(monkeypatch):
    config = engine_config(gpu_memory_utilization=0.9)
    plat = RocmPlatform()
    monkeypatch.setenv("VLLM_ROCM_GPU_MEMORY_UTILIZATION", "0.5")
    budget, why = RocmMemoryProfiler(plat, device=MI300X()).kv_cache_budget(config, 2 * GiB)
    assert budget == 96 * GiB - 40 * GiB - 2 * GiB and why.startswith("50% of 192.0 GiB")
    monkeypatch.delenv("VLLM_ROCM_GPU_MEMORY_UTILIZATION")
    assert (
        RocmMemoryProfiler(plat, device=MI300X()).kv_cache_budget(config, 2 * GiB)[0] == int(192 * GiB * 0.9) - 42 * GiB
    )
