"""The SDK's conformance kit; device checks skip with the reason off aarch64."""

from plugin_cpu_arm.platform import CpuArmPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = CpuArmPlatform
