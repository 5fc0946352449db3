"""The x86 CPU platform: ISA-dispatched C++ kernels, quantized activations, fused decode.

Thread binding, the ``CPU_*`` variables and the KV budget are the CPU family's
(:class:`plugins.cpu.CpuPlatform`); the kernels, their library and the fused runner are
native/'s, shared with cpu_arm and s390x (:class:`plugins.cpu_native.platform.NativeCpuPlatform`).
"""

from __future__ import annotations

from typing import Any

from plugins.cpu_native.library import IsaTable
from plugins.cpu_native.platform import NativeCpuPlatform, native_env_vars
from plugins.host import process_cpus
from plugins.memory import GiB, host_memory

from plugin_cpu_x86.cpuinfo import X86_MACHINES, machine, read_cpuinfo

_AVX512 = ("AVX512F", "AVX512BW", "AVX512VL", "AVX512DQ")
#: the library's variants (native/src/features_x86_64.cpp); feature names as /proc/cpuinfo's (upper case)
ISA_TABLE = IsaTable(
    module="plugin_cpu_x86._cx86",
    feature_bits=(*("AVX2", "FMA", "F16C"), *_AVX512, "AVX512_VNNI", "AVX512_BF16", "AMX"),
    requirements={
        "avx512amx": (*_AVX512, "AVX512_VNNI", "AVX512_BF16", "AMX", "AVX2", "FMA", "F16C"),
        "avx512bf16": (*_AVX512, "AVX512_VNNI", "AVX512_BF16", "AVX2", "FMA", "F16C"),
        "avx512vnni": (*_AVX512, "AVX512_VNNI", "AVX2", "FMA", "F16C"),
        "avx512": (*_AVX512, "AVX2", "FMA", "F16C"),
        "avx2": ("AVX2", "FMA", "F16C"),
        "scalar": (),
    },
    choices={
        "auto": ("avx512amx", "avx512bf16", "avx512vnni", "avx512", "avx2", "scalar"),
        "amx": ("avx512amx",),
        "avx512": ("avx512bf16", "avx512vnni", "avx512"),
        "avx512vnni": ("avx512vnni", "avx512"),
        "avx2": ("avx2",),
        "scalar": ("scalar",),
    },
)


class CpuX86Platform(NativeCpuPlatform):
    """x86-64 CPUs. Kernels: AVX-512 (+VNNI, +AMX tiles), AVX2+FMA or portable C++, chosen from cpuid.

    Thread binding (:meth:`init_device`) pins the calling thread, which must be the
    one that runs the model, the kernels' thread pool and torch's OpenMP team to the
    compute CPUs; the front end runs on the CPUs left over (:meth:`place_frontend_thread`).
    """

    name = "cpu_x86"
    api_version = 2
    supported_dtypes = ("float32", "bfloat16", "float16")
    isa_table = ISA_TABLE
    env_vars = native_env_vars(ISA_TABLE)

    def host_unavailable_reason(self) -> str | None:
        if machine() in X86_MACHINES:
            return None
        return f"not an x86-64 machine (platform.machine() is {machine()!r})"

    def device_info(self) -> dict[str, Any]:
        info = read_cpuinfo()
        total, available = host_memory()
        return {
            "name": info.model,
            "count": 1,
            "num_cpus": info.num_logical,
            "num_cpus_allowed": len(process_cpus()),
            "memory_total_gib": round(total / GiB, 1),
            "memory_available_gib": round(available / GiB, 1),
            "isa": info.isa,
            "kernel_isa": self.kernel_isa(info.isa),
        }
