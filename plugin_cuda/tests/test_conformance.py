"""The SDK's conformance kit: every kernel, the memory profiler, padding and end-to-end
generation against the reference platform (device checks skip without a GPU)."""

from plugin_cuda.platform import CudaPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = CudaPlatform
