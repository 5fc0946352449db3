"""plugins.hookspecs.FIRST_PARTY_DEVICES (what `--device` error messages suggest) is this repository's plugins."""

from pathlib import Path

import tomllib
from plugins.hookspecs import ENTRY_POINT_GROUP, FIRST_PARTY_DEVICES

REPO = Path(__file__).resolve().parents[2]


def test_first_party_devices_are_the_repositorys_plugins():
    found = {}
    for pyproject in sorted(REPO.glob("plugin_*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        (device,) = project["entry-points"][ENTRY_POINT_GROUP]
        found[device] = project["name"]
    assert found == {device: f"plugin_{device}" for device in FIRST_PARTY_DEVICES}
