"""The SDK's defaults pass its own conformance kit, and the kit catches a broken platform."""

import subprocess
import sys
import textwrap

import plugins
from plugins.reference import ReferencePlatform
from plugins.testing import PlatformConformance
from plugins.testing.runtime import first_difference


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


def run_kit_on_kernels(tmp_path, name, kernels, *args, float32_only=False):
    """Run the kit on a reference platform ``name`` whose kernel set is ``{name}Kernels``, a
    :class:`plugins.kernels.Kernels` subclass with the methods in ``kernels`` (source text)."""
    dtypes = '    supported_dtypes = ("float32",)\n' if float32_only else ""
    source = (
        "import torch\nfrom plugins.kernels import Kernels\nfrom plugins.reference import ReferencePlatform\n"
        f"from plugins.testing import PlatformConformance\n\nclass {name}Kernels(Kernels):\n"
        + textwrap.indent(textwrap.dedent(kernels), "    ")
        + f"\n\nclass {name}(ReferencePlatform):\n    name = {name.lower()!r}\n{dtypes}"
        + f"    def make_kernels(self):\n        return {name}Kernels()\n\n"
        + f"class Test{name}(PlatformConformance):\n    platform = {name}\n"
    )
    return run_kit(tmp_path, source, *args)


def test_availability_is_derived_from_unavailable_reason():
    class Absent(plugins.Platform):
        name = "absent"
        device_type = "cpu"
        priority = 0

        def unavailable_reason(self):
            return "no such device here"

    class OldStyle(plugins.Platform):  # overrides only is_available(), as plugins written before API 2 did
        name = "old"
        device_type = "cpu"
        priority = 0

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
    kernels = """
        def silu_and_mul(self, x):
            return super().silu_and_mul(x) * 1.01
    """
    result = run_kit_on_kernels(tmp_path, "Broken", kernels, "-k", "silu or rms", float32_only=True)
    assert result.returncode == 1, result.stdout
    assert "5 failed" in result.stdout and "silu_and_mul" in result.stdout  # 3 random-input, 2 edge-input checks


def test_unavailable_platform_skips_device_checks(tmp_path):
    result = run_kit(
        tmp_path,
        """
        import plugins
        from plugins.testing import PlatformConformance

        class Absent(plugins.Platform):
            name = "absent"
            device_type = "cpu"
            priority = 0
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
    kernels = """
        def paged_attention(self, q, k_cache, v_cache, meta, scale, sliding_window=None, kv_scale=None):
            packed = torch.as_strided(q, q.shape, q.contiguous().stride())  # ignores q's strides
            return super().paged_attention(packed, k_cache, v_cache, meta, scale, sliding_window, kv_scale)
    """
    result = run_kit_on_kernels(tmp_path, "Careless", kernels, "-k", "paged_attention", float32_only=True)
    assert result.returncode == 1, result.stdout
    # the sliding-window, edge-input and speculative-step cases pass contiguous q: they pass
    assert "2 failed, 11 passed" in result.stdout and ", fused qkv views (float32)" in result.stdout


def test_greedy_mismatch_names_both_sides_and_the_first_differing_step():
    same = [[1, 2, 3], [4, 5]]
    assert first_difference("acme", same, [[1, 2, 3], [4, 5]]) is None
    message = first_difference("acme", same, [[1, 2, 3], [4, 6]])
    assert message == (
        "prompt 1: acme and the reference platform first differ at generated token 1 "
        "(acme chose 5, the reference 6); acme: [4, 5]; reference: [4, 6]"
    )
    shorter = first_difference("acme", [[1, 2]], [[1, 2, 3]])
    assert "at generated token 2 (acme chose (nothing), the reference 3)" in shorter


def test_kit_greedy_failure_message(tmp_path):
    """End to end: a platform whose MLP is wrong fails the greedy check with the labelled message."""
    kernels = """
        def silu_and_mul(self, x):
            return super().silu_and_mul(x) * 0
    """
    result = run_kit_on_kernels(tmp_path, "Wrong", kernels, "-k", "greedy")
    assert result.returncode == 1, result.stdout
    assert "wrong and the reference platform first differ at generated token" in result.stdout
    assert "conformance kit: tests test_case.Wrong from" in result.stdout  # the header names the tested file


def test_kit_fails_a_platform_lacking_a_required_member(tmp_path):
    result = run_kit(
        tmp_path,
        """
        import plugins
        from plugins.testing import PlatformConformance

        class Unranked(plugins.Platform):
            name = "unranked"
            device_type = "cpu"
            def unavailable_reason(self):
                return None

        class TestUnranked(PlatformConformance):
            platform = Unranked
        """,
    )
    assert result.returncode != 0, result.stdout
    assert "Unranked lacks priority: members every plugins.Platform gives" in result.stdout


def test_kit_fails_an_abstract_base_under_test(tmp_path):
    """A base class declared abstract passes class creation; the kit's identity check still names what it lacks."""
    result = run_kit(
        tmp_path,
        """
        import plugins
        from plugins.testing import PlatformConformance

        class Family(plugins.Platform, abstract=True):
            name = "family"
            device_type = "cpu"

        class TestFamily(PlatformConformance):
            platform = Family
        """,
        "-k",
        "identity",
    )
    assert result.returncode == 1, result.stdout
    assert "Family lacks the required priority, unavailable_reason() (or is_available())" in result.stdout


def test_kit_fails_a_kernel_whose_signature_differs(tmp_path):
    """plugin_tpu's kernels once dropped kv_scale and core worked around it: the kit says so now."""
    kernels = """
        def paged_attention(self, q, k_cache, v_cache, meta, scale, sliding_window=None):
            return super().paged_attention(q, k_cache, v_cache, meta, scale, sliding_window)
    """
    result = run_kit_on_kernels(tmp_path, "Drifted", kernels, "-k", "signature")
    assert result.returncode == 1, result.stdout
    assert "1 failed" in result.stdout
    assert "DriftedKernels.paged_attention(self, q, k_cache, v_cache, meta, scale, sliding_window=None) but" in (
        result.stdout
    )


def test_kit_fails_an_encoder_attention_that_leaks_across_sequences(tmp_path):
    """Encoders' attention over the whole flattened batch as one sequence: right for one sequence, wrong for several."""
    kernels = """
        def encoder_attention(self, q, k, v, query_start_loc, seq_lens, scale):
            return super().encoder_attention(q, k, v, query_start_loc[[0, -1]], [sum(seq_lens)], scale)
    """
    result = run_kit_on_kernels(tmp_path, "Leaky", kernels, "-k", "encoder_attention", float32_only=True)
    assert result.returncode == 1, result.stdout
    assert (
        "5 failed, 1 passed" in result.stdout
        and "encoder_attention on seq_lens [5, 1, 17, 3], contiguous" in result.stdout
    )
