"""The SDK's defaults pass its own conformance kit, and the kit catches a broken platform."""

import subprocess
import sys
import textwrap

import plugins
from plugins.reference import ReferencePlatform
from plugins.testing import PlatformConformance, _first_difference


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

    class OldStyle(plugins.Platform):  # overrides only is_available(), as plugins written before API 2 did
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


def test_kit_fails_a_kernel_that_ignores_strides(tmp_path):
    """A kernel that reads q as if it were contiguous passes separate tensors but fails on
    head views of a fused qkv projection, as models pass them."""
    result = run_kit(
        tmp_path,
        """
        import torch
        from plugins.kernels import Kernels
        from plugins.reference import ReferencePlatform
        from plugins.testing import PlatformConformance

        class Packed(Kernels):
            def paged_attention(self, q, k_cache, v_cache, meta, scale, sliding_window=None):
                packed = torch.as_strided(q, q.shape, q.contiguous().stride())  # ignores q's strides
                return super().paged_attention(packed, k_cache, v_cache, meta, scale, sliding_window)

        class Careless(ReferencePlatform):
            name = "careless"
            supported_dtypes = ("float32",)
            def make_kernels(self):
                return Packed()

        class TestCareless(PlatformConformance):
            platform = Careless
        """,
        "-k",
        "paged_attention",
    )
    assert result.returncode == 1, result.stdout
    # the sliding-window cases pass contiguous q: they pass
    assert "2 failed, 7 passed" in result.stdout and "paged_attention (fused qkv views)" in result.stdout


def test_greedy_mismatch_names_both_sides_and_the_first_differing_step():
    same = [[1, 2, 3], [4, 5]]
    assert _first_difference("acme", same, [[1, 2, 3], [4, 5]]) is None
    message = _first_difference("acme", same, [[1, 2, 3], [4, 6]])
    assert message == (
        "prompt 1: acme and the reference platform first differ at generated token 1 "
        "(acme chose 5, the reference 6); acme: [4, 5]; reference: [4, 6]"
    )
    shorter = _first_difference("acme", [[1, 2]], [[1, 2, 3]])
    assert "at generated token 2 (acme chose (nothing), the reference 3)" in shorter


def test_kit_greedy_failure_message(tmp_path):
    """End to end: a platform whose MLP is wrong fails the greedy check with the labelled message."""
    result = run_kit(
        tmp_path,
        """
        from plugins.kernels import Kernels
        from plugins.reference import ReferencePlatform
        from plugins.testing import PlatformConformance

        class NoMlp(Kernels):
            def silu_and_mul(self, x):
                return super().silu_and_mul(x) * 0

        class Wrong(ReferencePlatform):
            name = "wrong"
            def make_kernels(self):
                return NoMlp()

        class TestWrong(PlatformConformance):
            platform = Wrong
        """,
        "-k",
        "greedy",
    )
    assert result.returncode == 1, result.stdout
    assert "wrong and the reference platform first differ at generated token" in result.stdout
    assert "conformance kit: tests test_case.Wrong from" in result.stdout  # the header names the tested file
