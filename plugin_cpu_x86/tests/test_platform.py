"""Platform identity, env config, thread-binding plan, KV budget and conformance."""

from __future__ import annotations

import os
import subprocess
import sys

import plugins
import pytest
from plugin_cpu_x86.platform import ISA_TABLE, CpuX86Platform
from plugins.cpu_native.library import select_isa
from plugins.host import process_cpus
from plugins.memory import GiB
from plugins.reference import engine_config
from plugins.testing import PlatformConformance

from plugin_cpu_x86 import cpuinfo


class TestConformance(PlatformConformance):
    platform = CpuX86Platform


def test_import_is_cheap():
    code = "import sys, plugin_cpu_x86; assert 'torch' not in sys.modules, 'torch imported at plugin import'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_identity_and_device_info():
    plat = CpuX86Platform()
    assert (plat.name, plat.device_type, plat.priority) == ("cpu_x86", "cpu", 10)
    assert plat.is_available() and plat.unavailable_reason() is None
    info = plat.device_info()
    assert info["num_cpus"] >= 1 and info["memory_total_gib"] > 0
    assert info["kernel_isa"] in ("avx512amx", "avx512bf16", "avx512vnni", "avx512", "avx2", "scalar")
    assert set(info["isa"]) <= set(cpuinfo.ISA_FLAGS.values())


def test_kernel_isa_extension():
    """The escape hatch answers the ISA variant the kernels run, and None for a name it lacks."""
    plat = CpuX86Platform()
    assert plat.get_extension("kernel_isa") == plat.kernels.isa == plat.device_info()["kernel_isa"]
    assert plat.get_extension("frontend_cpus") is None


def test_unavailable_on_other_machines(monkeypatch):
    monkeypatch.setattr(cpuinfo, "machine", lambda: "aarch64")
    monkeypatch.setattr("plugin_cpu_x86.platform.machine", lambda: "aarch64")
    plat = CpuX86Platform()
    assert not plat.is_available()
    assert "aarch64" in plat.unavailable_reason()


def test_env_values():
    plat = CpuX86Platform()
    env = plat.read_env({"VLLM_CPU_KVCACHE_SPACE": "40", "CORE_CPU_OMP_THREADS_BIND": "0-31|32-63"})
    assert env["CPU_KVCACHE_SPACE"] == 40.0 and env["CPU_OMP_THREADS_BIND"] == "0-31|32-63"
    assert env["CPU_NUM_OF_RESERVED_CPU"] == 0 and env["CPU_KERNEL_ISA"] == "auto"
    for name, bad in [
        ("CPU_KVCACHE_SPACE", "-1"),
        ("CPU_KVCACHE_SPACE", "lots"),
        ("CPU_OMP_THREADS_BIND", "0-x"),
        ("CPU_OMP_THREADS_BIND", "3-1"),
        ("CPU_NUM_OF_RESERVED_CPU", "-2"),
        ("CPU_KERNEL_ISA", "avx1024"),
    ]:
        with pytest.raises(plugins.EnvConfigError, match=f"CORE_{name}"):
            plat.read_env({f"CORE_{name}": bad})


def test_isa_selection():
    full = ["AVX2", "FMA", "F16C", "AVX512F", "AVX512BW", "AVX512VL", "AVX512DQ", "AVX512_VNNI"]
    assert select_isa(ISA_TABLE, "auto", full) == "avx512vnni"
    assert select_isa(ISA_TABLE, "auto", [*full, "AVX512_BF16", "AMX"]) == "avx512amx"
    assert select_isa(ISA_TABLE, "auto", [*full, "AVX512_BF16"]) == "avx512bf16"  # Zen 4/5
    assert select_isa(ISA_TABLE, "avx512", [*full, "AVX512_BF16", "AMX"]) == "avx512bf16"  # the tile unit off
    assert select_isa(ISA_TABLE, "avx512vnni", [*full, "AVX512_BF16", "AMX"]) == "avx512vnni"
    assert select_isa(ISA_TABLE, "avx512", full[:-1]) == "avx512"
    assert select_isa(ISA_TABLE, "avx2", full) == "avx2"
    assert select_isa(ISA_TABLE, "auto", ["AVX2", "FMA"]) == "scalar"  # AVX2 build also needs F16C
    with pytest.raises(ValueError, match="CPU_KERNEL_ISA='avx512' needs AVX512F"):
        select_isa(ISA_TABLE, "avx512", ["AVX2", "FMA", "F16C"])


def test_kv_cache_budget(monkeypatch):
    """The CPU family's budget (plugins/tests/test_cpu.py has the precedence rule)."""
    plat = CpuX86Platform()
    assert plat.memory.needs_profile_run is False
    monkeypatch.setenv("CORE_CPU_KVCACHE_SPACE", "0.25")
    budget, why = plat.memory.kv_cache_budget(engine_config(), 0)
    assert budget == GiB // 4 and "CPU_KVCACHE_SPACE=0.25" in why
    auto = CpuX86Platform()
    monkeypatch.setenv("CORE_CPU_KVCACHE_SPACE", "0")
    budget, why = auto.memory.kv_cache_budget(engine_config(), 0)
    assert 0 < budget <= auto.memory.free_memory() and "auto" in why
    monkeypatch.setenv("CORE_CPU_KVCACHE_SPACE", "100000")
    with pytest.raises(ValueError, match="CPU_KVCACHE_SPACE=100000"):
        CpuX86Platform().memory.kv_cache_budget(engine_config(), 0)


def test_init_device_binds_threads(monkeypatch):
    import threading

    import torch

    monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", "all")
    plat = CpuX86Platform()
    mine = process_cpus()  # as read before any binding (other tests may have pinned this thread)
    seen = []

    def bind_and_record(platform, then=None):  # init_device binds the calling thread only: run it on its own
        platform.init_device(engine_config())
        seen.append((sorted(os.sched_getaffinity(0)), platform.kernels.num_threads))
        if then:  # a thread started by a bound one (the server's engine thread) inherits its pin;
            # it builds a second platform, as a second engine in the process does
            child = threading.Thread(target=then, args=(CpuX86Platform(),))
            child.start()
            child.join()

    before = torch.get_num_threads()
    worker = threading.Thread(target=bind_and_record, args=(plat, bind_and_record))
    worker.start()
    worker.join()
    torch.set_num_threads(before)
    # each binding thread is pinned to the first compute CPU, its pool to the others, and
    # the second binding (another platform object) still plans every CPU the process may use
    assert seen == [([mine[0]], len(mine)), ([mine[0]], len(mine))]
    assert plat.frontend_cpus == mine and plat.get_extension("frontend_cpus") is None
