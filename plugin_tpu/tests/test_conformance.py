"""The SDK's conformance kit; device checks skip with the reason without a TPU."""

from plugin_tpu.platform import TpuPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = TpuPlatform
