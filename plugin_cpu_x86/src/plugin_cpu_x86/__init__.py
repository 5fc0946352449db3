"""x86 CPU backend for `core`: C++ AVX-512/AVX2 kernels chosen at load from cpuid.

Importing this module is cheap (no torch, no native library): the platform class is
imported only when the engine asks for it through :func:`register_platform`.
"""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_cpu_x86.platform import CpuX86Platform

    return CpuX86Platform
