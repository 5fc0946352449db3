"""The SDK's conformance kit; device checks skip with the reason without a ROCm GPU."""

from plugin_rocm.platform import RocmPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = RocmPlatform
