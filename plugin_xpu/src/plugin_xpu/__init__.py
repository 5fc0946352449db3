"""Backend plugin for Intel GPUs through torch's XPU build. Cheap to import: no torch here."""

import plugins


@plugins.hookimpl
def register_platform():
    """Return :class:`plugin_xpu.platform.XpuPlatform`."""
    from plugin_xpu.platform import XpuPlatform

    return XpuPlatform
