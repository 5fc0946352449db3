"""The SDK's conformance kit; device checks skip with the reason without an Intel GPU."""

from plugin_xpu.platform import XpuPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = XpuPlatform
