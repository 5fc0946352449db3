"""The SDK's conformance kit on the OpenVINO platform (its greedy generation runs the OpenVINO graph)."""

from plugin_openvino.platform import OpenVinoPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = OpenVinoPlatform
