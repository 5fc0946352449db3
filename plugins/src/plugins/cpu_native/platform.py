""":class:`NativeCpuPlatform`: a CPU backend that runs native/'s kernels (x86, ARM, IBM Z).

It adds to the CPU family (:class:`plugins.cpu.CpuPlatform`) what the three plugins built
on native/ share: loading their library, choosing its ISA variant (``CPU_KERNEL_ISA``),
the kernels and the fused runner, and pinning the kernels' thread pool. A subclass names
its library and variants (:attr:`isa_table`) and says whether the host CPU fits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from plugins.cpu import CPU_ENV_VARS, CpuPlatform
from plugins.cpu_native.library import IsaTable, library_path, select_isa
from plugins.env import EnvVar
from plugins.errors import PluginError

logger = logging.getLogger(__name__)


def native_env_vars(table: IsaTable) -> tuple[EnvVar, ...]:
    """The family's ``CPU_*`` variables plus the native kernels' own, for ``table``'s variants."""
    return CPU_ENV_VARS + (
        EnvVar("CPU_KERNEL_ISA", str, "auto", "force a kernel path (tests, debugging)", choices=tuple(table.choices)),
        EnvVar(
            "CPU_QUANT_ACTIVATIONS",
            bool,
            False,
            "GGUF/int8 linears round activations to int8 per block of 32, as llama.cpp does, on weights "
            "repacked in groups of 8 rows (by default int16 ones where that kernel is vectorized, else float32; "
            "~1.1x faster decode at batch 1, 1.5x batched and prefill on AVX-512 VNNI; greedy tokens no longer "
            "match transformers' on the dequantized weights)",
        ),
        EnvVar(
            "CPU_MOE_PREPACK",
            bool,
            True,
            "pack mixture-of-experts weights at load as the dense linears' are (GGUF experts in groups of 8 "
            "rows, bfloat16 ones in AVX512_BF16 tiles); 0: compute the experts as stored",
        ),
        EnvVar(
            "CPU_BF16_PREPACK",
            bool,
            True,
            "bfloat16 models on AVX512_BF16 CPUs without AMX: keep each GGUF/int8 linear's weights also rounded to "
            "bfloat16 and packed (2 bytes a weight more) for products of 8 or more rows (batched decode, prefill: "
            "~1.5x their speed); 0: dequantize the weights in every product",
        ),
        EnvVar(
            "CPU_FUSED_DECODE",
            bool,
            True,
            "run Llama-family models as one native call a step (same kernels and results as "
            "eager, without the Python between them)",
        ),
    )


class NativeCpuPlatform(CpuPlatform, abstract=True):
    """Base of the CPU backends with native kernels. Subclasses set ``name``,
    :attr:`isa_table`, ``env_vars = native_env_vars(isa_table)`` and implement
    :meth:`host_unavailable_reason`."""

    #: the plugin's kernel library and its ISA variants
    isa_table: ClassVar[IsaTable]

    def host_unavailable_reason(self) -> str | None:
        """Why the host CPU cannot run the plugin (wrong processor, missing base ISA), or None."""
        raise NotImplementedError

    def unavailable_reason(self) -> str | None:
        reason = self.host_unavailable_reason()
        if reason is None:
            try:
                library_path(self.isa_table)
            except PluginError as exc:
                return str(exc)
        return reason

    def kernel_isa(self, features: list[str]) -> str:
        """The variant ``CPU_KERNEL_ISA`` picks on a CPU with ``features`` (names of the table's
        feature bits), or ``"unavailable: <why>"``; reads no library (that imports torch)."""
        try:
            library_path(self.isa_table)
            return select_isa(self.isa_table, self.env["CPU_KERNEL_ISA"], features)
        except (PluginError, ValueError) as exc:
            return f"unavailable: {exc}"

    def make_kernels(self):
        from plugins.cpu_native.kernels import NativeCpuKernels

        choice, quantize = self.env["CPU_KERNEL_ISA"], self.env["CPU_QUANT_ACTIVATIONS"]
        kernels = NativeCpuKernels(
            self.isa_table,
            choice,
            quantize_activations=quantize,
            moe_prepack=self.env["CPU_MOE_PREPACK"],
            bf16_prepack=self.env["CPU_BF16_PREPACK"],
        )
        logger.info(
            "%s kernels: %s path (CPU_KERNEL_ISA=%s); GGUF/int8 linears on %s",
            self.name,
            kernels.isa,
            choice,
            "int8 activations (CPU_QUANT_ACTIVATIONS=1)"
            if quantize
            else "int16 (where the x8 kernel is vectorized) or float32 activations "
            "(CORE_CPU_QUANT_ACTIVATIONS=1: int8 ones, as llama.cpp)",
        )
        return kernels

    def get_extension(self, name: str) -> Any | None:
        """``"kernel_isa"``: the ISA variant the kernels run (``"avx512"``, ``"neon"``, ...)."""
        return self.kernels.isa if name == "kernel_isa" else None

    def make_communicator(self, rank: int, world_size: int, init_method: str, ranks: Sequence[int] | None = None):
        """Ranks on this host share a buffer (:class:`plugins.cpu_native.shm.SharedMemoryCommunicator`),
        whose all-reduce the fused decoder calls in its layer loop; ranks on several hosts use gloo."""
        from plugins.cpu_native.shm import SharedMemoryCommunicator

        return SharedMemoryCommunicator(self.kernels.lib, rank, world_size, init_method, ranks=ranks)

    def make_runner(self):
        from plugins.cpu_native.runner import NativeCpuRunner

        return NativeCpuRunner(self)

    def bind_compute_threads(self, cpus: list[int]) -> str:
        """One compute thread per CPU, pinned to it: the kernels' pool (native/src/pool.cpp) and
        torch's OpenMP team. Torch stays at one thread in the engine thread except inside
        the kernels' GEMMs (prefill, dense linears): its idle OpenMP workers spin, and
        would steal the CPUs from the kernels' pool in every decode step."""
        import torch

        torch.set_num_threads(len(cpus))
        self.kernels.num_threads = len(cpus)
        failed = self.kernels.lib.bind_threads(cpus)  # also starts torch's team, to pin it
        torch.set_num_threads(1)
        return f", {failed} failed to pin" if failed else ""
