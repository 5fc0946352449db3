"""The example plugin, installed for real: discovered, selectable, and passing the kit."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "plugins" / "examples" / "toy_plugin"


def pip_install_target(source, target):
    """`pip install` (not editable) ``source`` into the folder ``target`` (dependencies come from the venv)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(source)],
        check=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory):
    """The example, installed into a fresh target folder."""
    if not EXAMPLE.exists():
        pytest.fail(f"the example plugin is missing: {EXAMPLE}")
    target = tmp_path_factory.mktemp("toy_site")
    pip_install_target(EXAMPLE, target)
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


TOY_KIT = (
    "from plugins.testing import PlatformConformance\n"
    "from toy_plugin import ToyPlatform\n\n"
    "class TestToy(PlatformConformance):\n"
    "    platform = ToyPlatform\n"
)


def run_kit(site, tmp_path, source, *args):
    """Run pytest on a test module written from ``source`` with ``site`` on the path."""
    test_file = tmp_path / "test_kit_case.py"
    test_file.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib", str(test_file),
         *args],
        env=_env(site),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # fmt: skip


def test_example_passes_conformance(toy_site, tmp_path):
    """Every check runs and passes, but the KV cache dtype checks: an optional feature the
    toy does not declare (``supported_kv_cache_dtypes``) is skipped, saying so."""
    result = run_kit(toy_site, tmp_path, TOY_KIT, "-rs")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "failed" not in result.stdout, result.stdout[-3000:]
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("declares no KV cache dtype besides the compute dtype" in line for line in skips), skips


def test_kit_fails_a_platform_its_entry_point_does_not_return(toy_site, tmp_path):
    """The kit's hook check: a platform of the toy_plugin package that the installed entry
    point's register_platform() does not return fails it, naming both."""
    source = (
        "import plugins\n"
        "from plugins.testing import PlatformConformance\n\n"
        "class Stray(plugins.Platform):\n"
        "    name = 'stray'\n"
        "    device_type = 'cpu'\n"
        "    priority = 0\n\n"
        "    def unavailable_reason(self):\n"
        "        return None\n\n"
        "Stray.__module__ = 'toy_plugin'  # as if toy_plugin defined it without registering it\n\n"
        "class TestStray(PlatformConformance):\n"
        "    platform = Stray\n"
    )
    result = run_kit(toy_site, tmp_path, source, "-k", "entry_point")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "1 failed" in result.stdout and "not Stray" in result.stdout and "ToyPlatform" in result.stdout


def test_kit_names_the_tested_copy_and_fails_a_stale_install(tmp_path):
    """A non-editable install tests the installed copy: the kit names it, and once the source
    tree it was installed from is edited, the kit fails naming the edited file."""
    source = tmp_path / "toy_src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path / "site"
    pip_install_target(source, site)
    with (source / "toy_plugin.py").open("a") as f:
        f.write("\n# edited after the install\n")
    result = run_kit(site, tmp_path, TOY_KIT, "-k", "identity or tested_copy")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "1 failed, 1 passed" in result.stdout
    installed, edited = site / "toy_plugin.py", source / "toy_plugin.py"
    assert f"conformance kit: tests toy_plugin.ToyPlatform from {installed}" in result.stdout
    assert f"installed from {source}, not editable" in result.stdout
    assert f"the kit imports {installed}, not the source you edit: {edited}" in result.stdout
