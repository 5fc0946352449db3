"""The example plugin, installed for real: discovered, selectable, and passing the kit."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "plugins" / "examples" / "toy_plugin"


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory):
    """`pip install` the example into a fresh target folder (dependencies come from the venv)."""
    if not EXAMPLE.exists():
        pytest.fail(f"the example plugin is missing: {EXAMPLE}")
    target = tmp_path_factory.mktemp("toy_site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(EXAMPLE),
        ],
        check=True,
    )
    return target


def _env(site):
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_core_devices_lists_the_example(toy_site):
    out = subprocess.run(
        [sys.executable, "-m", "core.cli", "devices", "--json"],
        env=_env(toy_site),
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert rows["toy"]["available"] and rows["toy"]["priority"] == 0


def test_example_passes_conformance(toy_site, tmp_path):
    test_file = tmp_path / "test_toy_conformance.py"
    test_file.write_text(
        "from plugins.testing import PlatformConformance\n"
        "from toy_plugin import ToyPlatform\n\n"
        "class TestToy(PlatformConformance):\n"
        "    platform = ToyPlatform\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib", str(test_file)],
        env=_env(toy_site),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "failed" not in result.stdout and "skipped" not in result.stdout


def test_kit_fails_a_platform_its_entry_point_does_not_return(toy_site, tmp_path):
    """The kit's hook check: a platform of the toy_plugin package that the installed entry
    point's register_platform() does not return fails it, naming both."""
    test_file = tmp_path / "test_stray_conformance.py"
    test_file.write_text(
        "import plugins\n"
        "from plugins.testing import PlatformConformance\n\n"
        "class Stray(plugins.Platform):\n"
        "    name = 'stray'\n"
        "    device_type = 'cpu'\n\n"
        "Stray.__module__ = 'toy_plugin'  # as if toy_plugin defined it without registering it\n\n"
        "class TestStray(PlatformConformance):\n"
        "    platform = Stray\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib", str(test_file),
         "-k", "entry_point"],
        env=_env(toy_site),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    assert "1 failed" in result.stdout and "not Stray" in result.stdout and "ToyPlatform" in result.stdout
