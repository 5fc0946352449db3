"""Backend plugin for AWS Trainium/Inferentia (Neuron). Cheap to import: no torch or torch_neuronx here."""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_neuron.platform import NeuronPlatform

    return NeuronPlatform
