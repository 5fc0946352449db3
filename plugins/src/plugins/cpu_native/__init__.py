"""The Python side of native/, the kernel core of the CPU plugins (cpu_x86, cpu_arm, s390x).

The three plugins build the same C++ sources for their processor (native/cpu_kernels.cmake)
into a library with one C ABI; this package is the one Python binding of it: the ctypes
loader (:mod:`.library`), the kernels (:mod:`.kernels`, :mod:`.linear`), the fused runner
(:mod:`.runner`) and :class:`~.platform.NativeCpuPlatform`. It lives in the SDK, next to
the CPU family it extends, so each plugin stays separately installable with no copy of it.
Importing this package is cheap: torch is imported by the kernel modules only.
"""
