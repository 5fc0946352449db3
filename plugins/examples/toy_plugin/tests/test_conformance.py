"""The SDK's conformance kit: one subclass inherits every check."""

from plugins.testing import PlatformConformance
from toy_plugin import ToyPlatform


class TestConformance(PlatformConformance):
    platform = ToyPlatform
