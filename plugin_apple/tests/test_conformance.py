"""The SDK's conformance kit; device checks skip with the reason off a Mac."""

from plugin_apple.platform import ApplePlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = ApplePlatform
