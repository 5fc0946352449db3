"""NVIDIA GPU backend for ``core``.

Importing this module is cheap: torch, triton and the CUDA libraries are imported
only once the platform is chosen (kernels, runner, memory profiler, device info).
"""

import plugins

__version__ = "0.1.0"


@plugins.hookimpl
def register_platform():
    """Return :class:`plugin_cuda.platform.CudaPlatform`."""
    from plugin_cuda.platform import CudaPlatform

    return CudaPlatform
