"""The kit's header names how the tested copy is installed, whatever else is on ``sys.path``."""

import importlib
import json
import sys

import pytest
from plugins import provenance

MODULE = (
    "import plugins\n\n"
    "class ToyX(plugins.Platform):\n"
    "    name = 'toy_x'\n"
    "    device_type = 'cpu'\n"
    "    priority = 0\n\n"
    "    def unavailable_reason(self):\n"
    "        return None\n"
)


def _metadata(folder, first_file):
    """A metadata folder of project toy_x 0.1.0 whose entry point is the toy_x module."""
    folder.mkdir(parents=True)
    (folder / first_file).write_text("Metadata-Version: 2.1\nName: toy_x\nVersion: 0.1.0\n")
    (folder / "entry_points.txt").write_text("[core.platforms]\ntoy_x = toy_x\n")
    return folder


@pytest.fixture
def source_tree(tmp_path, monkeypatch):
    """A source folder with the module and the egg-info a build leaves, first on ``sys.path``
    (as ``python -m pytest`` run in that folder puts it)."""
    source = tmp_path / "toy_x_src"
    source.mkdir()
    (source / "toy_x.py").write_text(MODULE)
    _metadata(source / "toy_x.egg-info", "PKG-INFO")
    monkeypatch.syspath_prepend(str(source))
    monkeypatch.delitem(sys.modules, "toy_x", raising=False)
    return source


def test_an_editable_install_is_named_editable_past_the_source_egg_info(source_tree, tmp_path, monkeypatch):
    site = tmp_path / "site"
    record = _metadata(site / "toy_x-0.1.0.dist-info", "METADATA")
    (record / "INSTALLER").write_text("pip\n")
    (record / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": source_tree.as_uri()}))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(source_tree))  # the build's egg-info comes first
    copy = provenance.tested_copy(importlib.import_module("toy_x").ToyX)
    assert (copy.distribution, copy.editable) == ("toy_x 0.1.0", True)
    assert copy.describe().endswith("(toy_x 0.1.0, editable install)")


def test_a_build_egg_info_alone_is_not_an_install(source_tree):
    copy = provenance.tested_copy(importlib.import_module("toy_x").ToyX)
    assert copy.distribution is None
    assert "(not an installed distribution)" in copy.describe()
