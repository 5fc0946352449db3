"""Backend plugin for Intel Gaudi (HPU). Cheap to import: no torch or habana_frameworks here."""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_hpu.platform import HpuPlatform

    return HpuPlatform
