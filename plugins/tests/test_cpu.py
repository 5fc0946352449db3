"""The SDK's CPU family: host facts, variables, thread selection, the KV budget and binding."""

import os
import threading

import pytest
from plugins import EnvConfigError
from plugins.cpu import CpuMemoryProfiler, CpuPlatform, CpuTopology, select_cpus
from plugins.host import cpuinfo_features, parse_cpu_list, process_cpus
from plugins.memory import GiB
from plugins.reference import engine_config

#: one NUMA node of 8 CPUs, no hyper-threads
FLAT = CpuTopology([list(range(8))], {})


class HostCpuPlatform(CpuPlatform):
    """A host-CPU platform as the CPU backends build it."""

    name = "some_cpu"

    def unavailable_reason(self) -> str | None:
        return None


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]
    assert parse_cpu_list("0-2, 5,7-8") == [0, 1, 2, 5, 7, 8]
    assert parse_cpu_list("0-3\n") == [0, 1, 2, 3]  # as sysfs writes it
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
    assert plat.read_env({"CORE_CPU_OMP_THREADS_BIND": "nobind"})["CPU_OMP_THREADS_BIND"] == "nobind"
    for name, bad in [
        ("CPU_OMP_THREADS_BIND", "0-3|x"),
        ("CPU_OMP_THREADS_BIND", "3-1"),
        ("CPU_KVCACHE_SPACE", "lots"),
        ("CPU_KVCACHE_SPACE", "-1"),
        ("CPU_NUM_OF_RESERVED_CPU", "1.5"),
        ("CPU_NUM_OF_RESERVED_CPU", "-2"),
    ]:
        with pytest.raises(EnvConfigError, match=f"CORE_{name}"):
            plat.read_env({f"CORE_{name}": bad})
    with pytest.raises(EnvConfigError, match="VLLM_CPU_KVCACHE_SPACE"):
        plat.read_env({"VLLM_CPU_KVCACHE_SPACE": "lots"})


def test_select_cpus():
    allowed = list(range(8))
    assert select_cpus("nobind", allowed) is None
    assert select_cpus("all", allowed) == allowed
    assert select_cpus("auto", allowed, num_reserved=2, topology=FLAT) == [0, 1, 2, 3, 4, 5]
    assert select_cpus("0-3|4-7", allowed, rank=1) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="none for rank 2"):
        select_cpus("0-3|4-7", allowed, rank=2)
    with pytest.raises(ValueError, match=r"\[8, 9\]"):
        select_cpus("6-9", allowed)
    with pytest.raises(ValueError, match=r"\[7\]"):
        select_cpus("6-7", [0, 1, 2, 3, 4, 5, 6])
    with pytest.raises(ValueError, match="leaves rank 0 of 1 no core"):
        select_cpus("auto", allowed, num_reserved=8, topology=FLAT)


def test_auto_splits_the_cores_between_more_ranks_than_nodes():
    allowed = list(range(8))
    assert [select_cpus("auto", allowed, rank=r, topology=FLAT, num_ranks=2) for r in range(2)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    # 3 ranks share 8 - 2 reserved cores: two each, the reserved pair left over
    assert [select_cpus("auto", allowed, rank=r, num_reserved=2, topology=FLAT, num_ranks=3) for r in range(3)] == [
        [0, 1],
        [2, 3],
        [4, 5],
    ]
    # two nodes of 2 cores x 2 hyper-threads, 4 ranks: one physical core each, node by node
    topo = CpuTopology([[0, 1, 4, 5], [2, 3, 6, 7]], {cpu: cpu % 4 for cpu in range(8)})
    assert [select_cpus("auto", allowed, rank=r, topology=topo, num_ranks=4) for r in range(4)] == [[0], [1], [2], [3]]
    # no more ranks than nodes: a node each
    assert select_cpus("auto", allowed, rank=1, topology=topo, num_ranks=2) == [2, 3]
    with pytest.raises(ValueError, match="rank 0 of 9 no core"):
        select_cpus("auto", allowed, topology=FLAT, num_ranks=9)


def test_auto_takes_one_numa_nodes_physical_cores_per_rank():
    # two nodes of 2 cores x 2 hyper-threads: CPU n and n+4 are siblings
    siblings = {cpu: cpu % 4 for cpu in range(8)}
    topo = CpuTopology([[0, 1, 4, 5], [2, 3, 6, 7]], siblings)
    allowed = list(range(8))
    assert select_cpus("auto", allowed, rank=0, topology=topo) == [0, 1]
    assert select_cpus("auto", allowed, rank=1, topology=topo) == [2, 3]
    assert select_cpus("auto", allowed, rank=2, topology=topo) == [0, 1]  # ranks wrap around the nodes
    assert select_cpus("auto", allowed, rank=1, num_reserved=1, topology=topo) == [2]
    # a sibling whose first thread this process may not use stands for its core
    assert select_cpus("auto", [4, 5, 6, 7], rank=0, topology=topo) == [4, 5]


def test_auto_on_this_machine():
    mine = process_cpus()
    auto = select_cpus("auto", mine)
    assert auto and set(auto) <= set(mine)
    if len(auto) > 1:
        assert select_cpus("auto", mine, num_reserved=1) == auto[:-1]
    with pytest.raises(ValueError, match="no core"):
        select_cpus("auto", mine, num_reserved=len(auto))


def test_cpuinfo_features():
    assert cpuinfo_features("processor\t: 0\nFeatures\t: fp asimd sve\n") == {"fp", "asimd", "sve"}
    assert cpuinfo_features("flags\t\t: fpu avx2\n") == {"fpu", "avx2"}
    assert cpuinfo_features("") == set()


def test_kv_budget_precedence(monkeypatch):
    """CPU_KVCACHE_SPACE wins when set; else the engine's kv_cache_bytes; else the auto share."""
    monkeypatch.setenv("CORE_CPU_KVCACHE_SPACE", "0.5")
    plat = HostCpuPlatform()
    profiler = plat.memory
    assert isinstance(profiler, CpuMemoryProfiler) and profiler.needs_profile_run is False
    plan = profiler.plan_kv_cache(engine_config(), block_bytes=1 << 20)
    assert plan.budget_bytes == 1 << 29 and plan.num_blocks == 512
    assert "CPU_KVCACHE_SPACE=0.5" in plan.detail
    assert profiler.plan_kv_cache(engine_config(kv_cache_bytes=1 << 20), block_bytes=1 << 20).num_blocks == 512
    monkeypatch.delenv("CORE_CPU_KVCACHE_SPACE")
    plat = HostCpuPlatform()
    assert plat.memory.plan_kv_cache(engine_config(kv_cache_bytes=1 << 20), block_bytes=1 << 20).num_blocks == 1
    budget, why = plat.memory.kv_cache_budget(engine_config(), 0)
    assert 0 < budget <= min(8 * GiB, plat.memory.free_memory()) and "auto" in why
    monkeypatch.setenv("CORE_CPU_KVCACHE_SPACE", "100000")
    with pytest.raises(ValueError, match="CPU_KVCACHE_SPACE=100000"):
        HostCpuPlatform().memory.kv_cache_budget(engine_config(), 0)


def test_kv_cache_is_allocated_uninitialized():
    import torch

    cache = HostCpuPlatform().memory.allocate_kv_cache((4, 16, 2, 8), torch.float32, torch.device("cpu"))
    assert cache.shape == (4, 16, 2, 8) and cache.dtype == torch.float32


def _in_thread(fn):
    """Run ``fn`` in a fresh thread (binding pins the calling thread only) and return its result."""
    result = []
    worker = threading.Thread(target=lambda: result.append(fn()))
    worker.start()
    worker.join()
    return result[0]


def test_binding_and_frontend_placement(monkeypatch):
    import torch

    mine = process_cpus()
    monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", f"{mine[0]}")
    plat = HostCpuPlatform()
    assert plat.frontend_cpus is None  # not bound yet
    before = torch.get_num_threads()

    def bind_then_serve():
        plat.init_device(engine_config())
        compute = sorted(os.sched_getaffinity(0))
        frontend = _in_thread(lambda: (plat.place_frontend_thread(), sorted(os.sched_getaffinity(0)))[1])
        return compute, frontend

    compute, frontend = _in_thread(bind_then_serve)
    torch.set_num_threads(before)
    assert compute == [mine[0]] and plat.compute_cpus == [mine[0]]
    assert frontend == plat.frontend_cpus == ([c for c in mine if c != mine[0]] or mine)


def test_nobind_leaves_threads_alone(monkeypatch):
    monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", "nobind")
    plat = HostCpuPlatform()
    affinity = _in_thread(lambda: (plat.init_device(engine_config()), sorted(os.sched_getaffinity(0)))[1])
    assert affinity == sorted(os.sched_getaffinity(0)) and plat.frontend_cpus is None


def test_default_step_budget_is_0_3_s_of_prefill_on_the_bound_cores(monkeypatch):
    """250 prompt tokens/s per core for 0.3 s, rounded up to 16, within [64, 2048]."""
    mine = process_cpus()
    monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", f"{mine[0]}")
    assert HostCpuPlatform().default_max_num_batched_tokens(engine_config()) == 80  # 75 -> a multiple of 16
    if len(mine) >= 2:
        monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", f"{mine[0]},{mine[1]}")
        assert HostCpuPlatform().default_max_num_batched_tokens(engine_config()) == 160
    if len(mine) >= 2:  # tensor parallel: each rank binds one core, and the two compute each step together
        monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", f"{mine[0]}|{mine[1]}")
        assert HostCpuPlatform().default_max_num_batched_tokens(engine_config(tensor_parallel_size=2)) == 160
    monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", "nobind")  # every allowed CPU, shared by the ranks
    expected = min(2048, max(64, -(-int(75 * len(mine)) // 16) * 16))
    assert HostCpuPlatform().default_max_num_batched_tokens(engine_config()) == expected


def test_a_process_started_from_a_pinned_thread_keeps_its_parents_cpus():
    """A worker spawned after an engine pinned its parent's thread (taskset stands in for the
    pin) plans on every CPU the parent had, not on the one it inherited the pin to."""
    import subprocess
    import sys

    mine = process_cpus()
    if len(mine) < 2:
        pytest.skip("needs two CPUs")
    code = "from plugins.host import process_cpus; print(process_cpus())"
    child = subprocess.run(
        ["taskset", "-c", str(mine[0]), sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert child.stdout.strip() == str(mine)
