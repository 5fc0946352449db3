"""Backend plugin for Google TPUs through torch_xla. Cheap to import: no torch or torch_xla here."""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_tpu.platform import TpuPlatform

    return TpuPlatform
