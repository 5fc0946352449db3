"""The SDK's conformance kit; device checks skip with the reason without a Neuron device."""

from plugin_neuron.platform import NeuronPlatform
from plugins.testing import PlatformConformance


class TestConformance(PlatformConformance):
    platform = NeuronPlatform
