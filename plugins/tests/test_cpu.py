"""The SDK's shared CPU pieces: variables, thread selection and the KV budget."""

import plugins
import pytest
from plugins import EnvConfigError
from plugins.cpu import CpuMemoryProfiler, cpu_env_vars, cpuinfo_features, parse_cpu_list, select_cpus


class HostCpuPlatform(plugins.Platform):
    """A host-CPU platform as the CPU backends build it."""

    name = "some_cpu"
    device_type = "cpu"
    env_vars = cpu_env_vars()

    def is_available(self) -> bool:
        return True

    def make_memory_profiler(self):
        return CpuMemoryProfiler(self)


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]
    for bad in ("", "a-b", "3-1", "1,,2", "-1"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_env_values_good_and_bad():
    plat = HostCpuPlatform()
    env = plat.read_env({"VLLM_CPU_KVCACHE_SPACE": "40", "CORE_CPU_OMP_THREADS_BIND": "0-31|32-63"})
    assert env["CPU_KVCACHE_SPACE"] == 40.0
    assert env["CPU_OMP_THREADS_BIND"] == "0-31|32-63"
    assert env["CPU_NUM_OF_RESERVED_CPU"] == 0
    assert plat.read_env({"CORE_CPU_OMP_THREADS_BIND": " ALL "})["CPU_OMP_THREADS_BIND"] == "all"
    with pytest.raises(EnvConfigError, match="CORE_CPU_OMP_THREADS_BIND"):
        plat.read_env({"CORE_CPU_OMP_THREADS_BIND": "0-3|x"})
    with pytest.raises(EnvConfigError, match="VLLM_CPU_KVCACHE_SPACE"):
        plat.read_env({"VLLM_CPU_KVCACHE_SPACE": "lots"})
    with pytest.raises(EnvConfigError, match="CORE_CPU_NUM_OF_RESERVED_CPU"):
        plat.read_env({"CORE_CPU_NUM_OF_RESERVED_CPU": "1.5"})


def test_select_cpus():
    allowed = list(range(8))
    assert select_cpus("nobind", allowed) is None
    assert select_cpus("all", allowed) == allowed
    assert select_cpus("auto", allowed, num_reserved=2) == [0, 1, 2, 3, 4, 5]
    assert select_cpus("0-3|4-7", allowed, rank=1) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="none for rank 2"):
        select_cpus("0-3|4-7", allowed, rank=2)
    with pytest.raises(ValueError, match=r"\[8, 9\]"):
        select_cpus("6-9", allowed)
    with pytest.raises(ValueError, match="leaves no CPU"):
        select_cpus("auto", allowed, num_reserved=8)


def test_cpuinfo_features():
    assert cpuinfo_features("processor\t: 0\nFeatures\t: fp asimd sve\n") == {"fp", "asimd", "sve"}
    assert cpuinfo_features("flags\t\t: fpu avx2\n") == {"fpu", "avx2"}
    assert cpuinfo_features("") == set()


def test_kv_budget_from_cpu_kvcache_space(monkeypatch):
    monkeypatch.setenv("CORE_CPU_KVCACHE_SPACE", "0.5")

    class Config:
        kv_cache_bytes = None

    plat = HostCpuPlatform()
    profiler = plat.memory
    assert isinstance(profiler, CpuMemoryProfiler)
    plan = profiler.plan_kv_cache(Config(), block_bytes=1 << 20)
    assert plan.budget_bytes == 1 << 29 and plan.num_blocks == 512
    assert "CPU_KVCACHE_SPACE=0.5" in plan.detail
    Config.kv_cache_bytes = 1 << 20  # an explicit engine setting wins over the variable
    assert profiler.plan_kv_cache(Config(), block_bytes=1 << 20).num_blocks == 1
