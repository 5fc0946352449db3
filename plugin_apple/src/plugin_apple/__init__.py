"""Backend plugin for Apple silicon GPUs (Metal Performance Shaders). Cheap to import: no torch here."""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_apple.platform import ApplePlatform

    return ApplePlatform
