"""The SDK's conformance kit; device checks skip with the reason off s390x."""

from plugin_s390x.platform import S390xPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = S390xPlatform
