"""A minimal third-party backend: the example of the plugin author guide.

Everything it does not define (kernels, memory profiler, runner, env config) comes
from :class:`plugins.Platform`'s device-neutral defaults, so ``core serve --device toy``
works with these few lines.
"""

import plugins


class ToyPlatform(plugins.Platform):
    name = "toy"  # what --device takes
    device_type = "cpu"  # the torch device type its tensors live on
    priority = 0  # --device auto picks the highest available
    api_version = 2  # the plugins.PLATFORM_API_VERSION it was written for

    def unavailable_reason(self) -> str | None:
        return None  # None: this machine can run it (any machine has a CPU)


@plugins.hookimpl
def register_platform():
    return ToyPlatform
