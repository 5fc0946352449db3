"""The plugin SDK: everything a hardware backend for `core` implements or reuses.

A backend is a Python distribution that registers a module under the entry-point
group ``core.platforms``; the module implements the :func:`register_platform` hook
and returns a :class:`Platform` subclass. Importing this package is cheap: torch is
imported only when a platform's kernels, memory profiler or runner are first used.
"""

from plugins.config import EngineConfigView
from plugins.env import EnvConfigError, EnvVar
from plugins.errors import PlatformUnavailable, PluginError, UnsupportedFeature
from plugins.hookspecs import PROJECT_NAME, hookimpl, hookspec
from plugins.platform import PLATFORM_API_VERSION, Platform

__all__ = [
    "PLATFORM_API_VERSION",
    "PROJECT_NAME",
    "EngineConfigView",
    "EnvConfigError",
    "EnvVar",
    "Platform",
    "PlatformUnavailable",
    "PluginError",
    "UnsupportedFeature",
    "hookimpl",
    "hookspec",
]
