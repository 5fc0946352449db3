"""The x86 CPU platform: ISA-dispatched C++ kernels, thread binding, KV budgeting."""

from __future__ import annotations

import logging
import os
from typing import Any

import plugins
from plugins.memory import GiB, host_memory

from plugin_cpu_x86.cpuinfo import X86_MACHINES, machine, parse_threads_bind, plan_compute_cpus, read_cpuinfo

logger = logging.getLogger(__name__)


def _kv_space(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError("must be >= 0 (GiB; 0 = auto)")
    return value


def _reserved(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


_process_cpus: list[int] | None = None


def process_cpus() -> list[int]:
    """The CPUs this process may use, as read before the first thread binding.

    Binding pins the calling thread to one CPU; a thread it starts later (the server's
    engine thread) and a second engine built in the same thread would otherwise take that
    single CPU for all the process has (a second ``LLM`` decoded 1.8x slower on one core).
    """
    global _process_cpus
    if _process_cpus is None:
        _process_cpus = sorted(os.sched_getaffinity(0))
    return _process_cpus


class CpuX86Platform(plugins.Platform):
    """x86-64 CPUs. Kernels: AVX-512 (+VNNI), AVX2+FMA or portable C++, chosen from cpuid.

    Thread binding (:meth:`init_device`) pins the calling thread, which must be the
    one that runs the model, and its OpenMP pool to the compute CPUs. The front end
    stays off them by running on the CPUs left over: ``get_extension("frontend_cpus")``
    lists them (the ``CPU_NUM_OF_RESERVED_CPU`` cores under ``auto`` binding) for the
    server to pass to ``os.sched_setaffinity`` in its own threads.
    """

    name = "cpu_x86"
    device_type = "cpu"
    priority = 10
    supported_dtypes = ("float32", "bfloat16", "float16")
    env_vars = (
        plugins.EnvVar("CPU_KVCACHE_SPACE", _kv_space, 0.0, "KV cache size in GiB (0 = auto share of free memory)"),
        plugins.EnvVar(
            "CPU_OMP_THREADS_BIND",
            parse_threads_bind,
            "auto",
            "CPUs for the compute threads: auto (a NUMA node's physical cores per rank), all, "
            "or lists like 0-31|32-63 (one per rank)",
        ),  # fmt: skip
        plugins.EnvVar(
            "CPU_NUM_OF_RESERVED_CPU", _reserved, 0, "cores kept free for the front end (auto binding only)"
        ),
        plugins.EnvVar(
            "CPU_KERNEL_ISA",
            str,
            "auto",
            "force a kernel path (tests, debugging)",
            choices=("auto", "avx512", "avx2", "scalar"),
        ),  # fmt: skip
        plugins.EnvVar(
            "CPU_QUANT_ACTIVATIONS",
            bool,
            False,
            "GGUF/int8 linears round activations to int8 per block of 32, as llama.cpp does, on weights "
            "repacked in groups of 8 rows (~2x faster decode at batch 1, 1.1-1.5x batched; results no longer "
            "match the dequantized float32 product)",
        ),  # fmt: skip
        plugins.EnvVar(
            "CPU_FUSED_DECODE",
            bool,
            True,
            "run Llama-family models as one native call a step (same kernels and results as "
            "eager, without the Python between them)",
        ),  # fmt: skip
    )

    def __init__(self) -> None:
        self._frontend_cpus: list[int] | None = None

    def is_available(self) -> bool:
        return machine() in X86_MACHINES

    def unavailable_reason(self) -> str | None:
        if self.is_available():
            return None
        return f"not an x86-64 machine (platform.machine() is {machine()!r})"

    def device_info(self) -> dict[str, Any]:
        info = read_cpuinfo()
        total, available = host_memory()
        result: dict[str, Any] = {
            "name": info.model,
            "count": 1,
            "num_cpus": info.num_logical,
            "num_cpus_allowed": len(process_cpus()),
            "memory_total_gib": round(total / GiB, 1),
            "memory_available_gib": round(available / GiB, 1),
            "isa": info.isa,
        }
        # from /proc/cpuinfo and the library's presence: loading it would import torch (seconds)
        from plugin_cpu_x86.native import library_path, select_isa

        try:
            library_path()
            result["kernel_isa"] = select_isa(self.env["CPU_KERNEL_ISA"], info.isa)
        except (plugins.PluginError, ValueError) as exc:
            result["kernel_isa"] = f"unavailable: {exc}"
        return result

    def make_kernels(self):
        from plugin_cpu_x86.kernels import CpuX86Kernels

        kernels = CpuX86Kernels(self.env["CPU_KERNEL_ISA"], quantize_activations=self.env["CPU_QUANT_ACTIVATIONS"])
        logger.info(
            "cpu_x86 kernels: %s path (CPU_KERNEL_ISA=%s); GGUF/int8 linears on %s",
            kernels.isa,
            self.env["CPU_KERNEL_ISA"],
            "int8 activations (CPU_QUANT_ACTIVATIONS=1)"
            if kernels.quantize_activations
            else "float32 activations (exact; CORE_CPU_QUANT_ACTIVATIONS=1: int8 ones, as llama.cpp, ~2x decode)",
        )
        return kernels

    def make_runner(self):
        from plugin_cpu_x86.runner import CpuX86Runner

        return CpuX86Runner(self)

    def make_memory_profiler(self):
        from plugin_cpu_x86.memory import CpuMemoryProfiler

        return CpuMemoryProfiler(self)

    def init_device(self, config: Any) -> None:
        """Bind the calling (engine) thread, torch's threads and the kernels' threads.

        One compute thread per chosen CPU, pinned to it: the kernels' pool (native/src/pool.cpp)
        and torch's OpenMP team. Torch stays at one thread in the engine thread except
        inside the kernels' GEMMs (prefill, dense linears): its idle OpenMP workers spin,
        and would steal the CPUs from the kernels' pool in every decode step.
        """
        import torch

        allowed = process_cpus()
        rank = getattr(config, "local_rank", None) or int(os.environ.get("LOCAL_RANK", "0"))
        bind, reserved = self.env["CPU_OMP_THREADS_BIND"], self.env["CPU_NUM_OF_RESERVED_CPU"]
        cpus = plan_compute_cpus(bind, reserved, rank, allowed)
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))
        self.kernels.num_threads = len(cpus)
        failed = self.kernels.lib.bind_threads(cpus)  # also starts torch's team, to pin it
        torch.set_num_threads(1)
        self._frontend_cpus = [c for c in allowed if c not in cpus] or allowed
        logger.info(
            "cpu_x86: %d compute threads on CPUs %s (CPU_OMP_THREADS_BIND=%s, reserved %d, rank %d)%s; "
            "front end CPUs %s",
            len(cpus), cpus, bind, reserved, rank, f", {failed} failed to pin" if failed else "",
            self._frontend_cpus,
        )  # fmt: skip

    def get_extension(self, name: str) -> Any | None:
        """``"frontend_cpus"``: CPUs left to the front end after :meth:`init_device`."""
        if name == "frontend_cpus":
            return self._frontend_cpus
        return None
