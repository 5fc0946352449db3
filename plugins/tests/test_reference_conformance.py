"""The SDK's defaults pass its own conformance kit, and the kit catches a broken platform."""

import subprocess
import sys
import textwrap

import plugins
from plugins.reference import ReferencePlatform
from plugins.testing import PlatformConformance


class ReferenceWithEnv(ReferencePlatform):
    env_vars = (
        plugins.EnvVar("REF_BLOCKS", int, 4, "an int"),
        plugins.EnvVar("REF_MODE", str, "fast", "a choice", choices=("fast", "slow")),
        plugins.EnvVar("REF_FLAG", bool, False, "a flag"),
    )


class TestReferenceConformance(PlatformConformance):
    platform = ReferenceWithEnv


def run_kit(tmp_path, source, *args):
    """Run pytest on a test module written from ``source``; returns the finished process."""
    (tmp_path / "test_case.py").write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path / "test_case.py"), *args],
        capture_output=True,
        text=True,
    )


def test_availability_is_derived_from_unavailable_reason():
    class Absent(plugins.Platform):
        name = "absent"
        device_type = "cpu"

        def unavailable_reason(self):
            return "no such device here"

    class OldStyle(plugins.Platform):  # overrides only is_available(), as DESIGN.md's minimal example
        name = "old"
        device_type = "cpu"

        def is_available(self):
            return False

    assert ReferencePlatform().is_available() and ReferencePlatform().unavailable_reason() is None
    assert not Absent().is_available() and Absent().unavailable_reason() == "no such device here"
    assert not OldStyle().is_available() and OldStyle().unavailable_reason() == "is_available() returned False"


def test_kit_fails_a_wrong_api_version(tmp_path):
    result = run_kit(
        tmp_path,
        """
        from plugins.reference import ReferencePlatform
        from plugins.testing import PlatformConformance

        class Future(ReferencePlatform):
            api_version = 99

        class TestFuture(PlatformConformance):
            platform = Future
        """,
        "-k",
        "api_version",
    )
    assert result.returncode == 1, result.stdout
    assert "1 failed" in result.stdout
    assert (
        f"api_version is 99, but this SDK provides PLATFORM_API_VERSION {plugins.PLATFORM_API_VERSION}" in result.stdout
    )


def test_kit_fails_a_wrong_kernel(tmp_path):
    """A platform whose silu_and_mul is wrong must fail the kit (the checks can fail)."""
    result = run_kit(
        tmp_path,
        """
        from plugins.kernels import Kernels
        from plugins.reference import ReferencePlatform
        from plugins.testing import PlatformConformance

        class Wrong(Kernels):
            def silu_and_mul(self, x):
                return super().silu_and_mul(x) * 1.01

        class Broken(ReferencePlatform):
            name = "broken"
            supported_dtypes = ("float32",)
            def make_kernels(self):
                return Wrong()

        class TestBroken(PlatformConformance):
            platform = Broken
        """,
        "-k",
        "silu or rms",
    )
    assert result.returncode == 1, result.stdout
    assert "3 failed" in result.stdout and "silu_and_mul" in result.stdout


def test_unavailable_platform_skips_device_checks(tmp_path):
    result = run_kit(
        tmp_path,
        """
        import plugins
        from plugins.testing import PlatformConformance

        class Absent(plugins.Platform):
            name = "absent"
            device_type = "cpu"
            def unavailable_reason(self):
                return "no such device here"

        class TestAbsent(PlatformConformance):
            platform = Absent
        """,
    )
    assert result.returncode == 0, result.stdout
    assert "no such device here" in result.stdout and "passed" in result.stdout
