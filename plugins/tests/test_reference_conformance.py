"""The SDK's defaults pass its own conformance kit, and the kit catches a broken kernel."""

import subprocess
import sys
import textwrap

import plugins
from plugins.testing import PlatformConformance


class ReferencePlatform(plugins.Platform):
    name = "reference"
    device_type = "cpu"
    env_vars = (
        plugins.EnvVar("REF_BLOCKS", int, 4, "an int"),
        plugins.EnvVar("REF_MODE", str, "fast", "a choice", choices=("fast", "slow")),
        plugins.EnvVar("REF_FLAG", bool, False, "a flag"),
    )

    def is_available(self) -> bool:
        return True


class TestReferenceConformance(PlatformConformance):
    platform = ReferencePlatform


def test_kit_fails_a_wrong_kernel(tmp_path):
    """A platform whose silu_and_mul is wrong must fail the kit (the checks can fail)."""
    (tmp_path / "test_broken.py").write_text(
        textwrap.dedent(
            """
            import plugins
            from plugins.kernels import Kernels
            from plugins.testing import PlatformConformance

            class Wrong(Kernels):
                def silu_and_mul(self, x):
                    return super().silu_and_mul(x) * 1.01

            class Broken(plugins.Platform):
                name = "broken"
                device_type = "cpu"
                supported_dtypes = ("float32",)
                def is_available(self):
                    return True
                def make_kernels(self):
                    return Wrong()

            class TestBroken(PlatformConformance):
                platform = Broken
            """
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_broken.py"),
            "-k",
            "silu or rms",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stdout
    assert "3 failed" in result.stdout and "silu_and_mul" in result.stdout


def test_unavailable_platform_skips_device_checks(tmp_path):
    (tmp_path / "test_absent.py").write_text(
        textwrap.dedent(
            """
            import plugins
            from plugins.testing import PlatformConformance

            class Absent(plugins.Platform):
                name = "absent"
                device_type = "cpu"
                def is_available(self):
                    return False
                def unavailable_reason(self):
                    return "no such device here"

            class TestAbsent(PlatformConformance):
                platform = Absent
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path / "test_absent.py")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout
    assert "no such device here" in result.stdout and "passed" in result.stdout
