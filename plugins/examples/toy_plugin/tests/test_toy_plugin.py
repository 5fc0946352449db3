"""The example plugin follows the contract: a Platform with the SDK defaults, a hook
(which the conformance kit checks through the installed entry point)."""

import importlib.metadata

import plugins
import pytest
import toy_plugin


def test_platform_identity():
    platform = toy_plugin.ToyPlatform()
    assert (platform.name, platform.device_type, platform.priority) == ("toy", "cpu", 0)
    assert platform.is_available()
    assert platform.unavailable_reason() is None
    assert platform.api_version == plugins.PLATFORM_API_VERSION


def test_entry_point_registered_when_installed():
    try:
        importlib.metadata.distribution("toy_plugin")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("toy_plugin is not installed (pip install ./plugins/examples/toy_plugin)")
    points = importlib.metadata.entry_points(group="core.platforms")
    assert {ep.name: ep.value for ep in points}.get("toy") == "toy_plugin"
    assert points["toy"].load() is toy_plugin


def test_defaults_come_from_the_sdk():
    platform = toy_plugin.ToyPlatform()
    assert type(platform.kernels).__module__ == "plugins.kernels"
    assert type(platform.runner).__module__ == "plugins.runner"
    assert platform.env == {}
