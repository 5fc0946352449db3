"""The x86 CPU platform: ISA-dispatched C++ kernels, quantized activations, fused decode.

Thread binding, the ``CPU_*`` variables and the KV budget are the CPU family's
(:class:`plugins.cpu.CpuPlatform`).
"""

from __future__ import annotations

import logging
from typing import Any

import plugins
from plugins.cpu import CPU_ENV_VARS, CpuPlatform
from plugins.host import process_cpus
from plugins.memory import GiB, host_memory

from plugin_cpu_x86.cpuinfo import X86_MACHINES, machine, read_cpuinfo

logger = logging.getLogger(__name__)


class CpuX86Platform(CpuPlatform):
    """x86-64 CPUs. Kernels: AVX-512 (+VNNI), AVX2+FMA or portable C++, chosen from cpuid.

    Thread binding (:meth:`init_device`) pins the calling thread, which must be the
    one that runs the model, the kernels' thread pool and torch's OpenMP team to the
    compute CPUs; the front end runs on the CPUs left over (:meth:`place_frontend_thread`).
    """

    name = "cpu_x86"
    api_version = 2
    supported_dtypes = ("float32", "bfloat16", "float16")
    env_vars = CPU_ENV_VARS + (
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

    def unavailable_reason(self) -> str | None:
        if machine() in X86_MACHINES:
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

    def bind_compute_threads(self, cpus: list[int]) -> str:
        """One compute thread per CPU, pinned to it: the kernels' pool (csrc/pool.cpp) and
        torch's OpenMP team. Torch stays at one thread in the engine thread except inside
        the kernels' GEMMs (prefill, dense linears): its idle OpenMP workers spin, and
        would steal the CPUs from the kernels' pool in every decode step."""
        import torch

        torch.set_num_threads(len(cpus))
        self.kernels.num_threads = len(cpus)
        failed = self.kernels.lib.bind_threads(cpus)  # also starts torch's team, to pin it
        torch.set_num_threads(1)
        return f", {failed} failed to pin" if failed else ""
