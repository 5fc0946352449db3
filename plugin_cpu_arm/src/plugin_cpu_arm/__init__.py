"""Backend plugin for ARM AArch64 CPUs with NEON. Cheap to import: no torch here."""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_cpu_arm.platform import CpuArmPlatform

    return CpuArmPlatform
