"""Exceptions shared by the engine and its plugins."""


class PluginError(Exception):
    """A plugin could not be loaded or does not follow the SDK contract."""


class PlatformUnavailable(PluginError):
    """A platform was requested but cannot run on this machine; the message says why."""


class UnsupportedFeature(ValueError):
    """A platform was asked for something it does not support (a dtype, a quantization)."""
