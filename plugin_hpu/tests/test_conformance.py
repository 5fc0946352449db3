"""The SDK's conformance kit; device checks skip with the reason without a Gaudi."""

from plugin_hpu.platform import HpuPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = HpuPlatform
