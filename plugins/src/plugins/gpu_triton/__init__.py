"""Triton kernels of the GPU plugins (cuda, rocm, xpu): one copy, imported by all three.

Triton compiles one source for NVIDIA (PTX), AMD (AMDGCN) and Intel (SPIR-V) targets, so
the kernels (:mod:`.ops`, :mod:`.attention`, the skinny GEMM :mod:`.gemv`), the split-K
plan (:mod:`.splits`), the kernel set :class:`~.kernels.TritonKernels` and the offline
compile check (:mod:`.compile_check`) live in the SDK next to the GPU family that uses
them, like :mod:`plugins.cpu_native` for the CPU plugins: each plugin stays separately
installable with no copy of them. Importing this package is cheap: torch and triton are
imported by its modules only, and only a plugin that chose Triton imports those (the SDK
itself does not depend on triton; the plugins that use it do).
"""
