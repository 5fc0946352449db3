"""This repository's plugins: plugins.hookspecs.FIRST_PARTY_DEVICES (what `--device` error messages
suggest) names them, and each states the API version it was written for as a number."""

import ast
from pathlib import Path

import pytest
import tomllib
from plugins import PLATFORM_API_VERSION
from plugins.hookspecs import ENTRY_POINT_GROUP, FIRST_PARTY_DEVICES

REPO = Path(__file__).resolve().parents[2]


def test_first_party_devices_are_the_repositorys_plugins():
    found = {}
    for pyproject in sorted(REPO.glob("plugin_*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        (device,) = project["entry-points"][ENTRY_POINT_GROUP]
        found[device] = project["name"]
    assert found == {device: f"plugin_{device}" for device in FIRST_PARTY_DEVICES}


@pytest.mark.parametrize("plugin", sorted(p.name for p in REPO.glob("plugin_*") if (p / "pyproject.toml").exists()))
def test_each_plugin_states_a_literal_api_version(plugin):
    """``api_version = 2``, not the SDK's own constant: a constant always equals the SDK it is
    imported from, so the version check could never catch a plugin written for another one."""
    stated = [
        (path.name, node.value)
        for path in sorted((REPO / plugin / "src").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "api_version" for t in node.targets)
    ]
    assert stated, f"{plugin} states no api_version"
    for file, value in stated:
        assert isinstance(value, ast.Constant) and value.value == PLATFORM_API_VERSION, (
            f"{plugin}/{file}: api_version = {ast.unparse(value)}; state the number, {PLATFORM_API_VERSION}"
        )
