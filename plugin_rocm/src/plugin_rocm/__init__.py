"""Backend plugin for AMD GPUs through ROCm. Cheap to import: no torch here."""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_rocm.platform import RocmPlatform

    return RocmPlatform
