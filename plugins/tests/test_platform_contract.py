"""The backend contract: the four required members are checked as a platform class is created,
and a kernel set's signatures are compared with the SDK's (the kit's checks of both are in
test_reference_conformance.py)."""

import pytest
from plugins import Platform, hookimpl
from plugins.kernels import Kernels
from plugins.platform import missing_members
from plugins.testing.kernel_checks import signature_drift

REQUIRED = {"name": "toy", "device_type": "cpu", "priority": 0}


def available(self):
    return None


@pytest.mark.parametrize("left_out", [*REQUIRED, "availability"])
def test_a_platform_lacking_a_required_member_fails_at_class_creation(left_out):
    body = {k: v for k, v in REQUIRED.items() if k != left_out}
    if left_out != "availability":
        body["unavailable_reason"] = available
    wanted = "unavailable_reason\\(\\) \\(or is_available\\(\\)\\)" if left_out == "availability" else left_out
    with pytest.raises(TypeError, match=f"^Partial lacks {wanted}: members every plugins.Platform gives"):
        type("Partial", (Platform,), body)


def test_design_minimal_example_as_written():
    """DESIGN.md section 3's minimal platform, character for character: it is complete."""

    class ToyPlatform(Platform):
        name = "toy"  # what --device takes
        device_type = "cpu"  # the torch device type its tensors live on
        priority = 0  # --device auto picks the highest available

        def is_available(self) -> bool:
            return True

    @hookimpl
    def register_platform():
        return ToyPlatform

    assert register_platform() is ToyPlatform and missing_members(ToyPlatform) == []
    assert ToyPlatform().is_available() and ToyPlatform().unavailable_reason() is None


def test_an_abstract_base_may_leave_members_to_its_subclasses():
    class Family(Platform, abstract=True):
        device_type = "cpu"
        priority = 10

    assert missing_members(Family) == ["name", "unavailable_reason() (or is_available())"]

    class Member(Family):
        name = "member"
        unavailable_reason = available

    assert missing_members(Member) == []
    with pytest.raises(TypeError, match="^Nameless lacks name:"):
        type("Nameless", (Family,), {"unavailable_reason": available})


def test_signature_drift_names_the_op_and_both_signatures():
    class NoScale(Kernels):
        def write_kv_cache(self, k, v, k_cache, v_cache, slot_mapping):
            return super().write_kv_cache(k, v, k_cache, v_cache, slot_mapping)

    class Renamed(Kernels):
        def rms_norm(self, x, w, eps):  # a keyword caller passing weight= breaks
            return super().rms_norm(x, w, eps)

    assert signature_drift(Kernels()) == []
    assert signature_drift(NoScale()) == [
        "NoScale.write_kv_cache(self, k, v, k_cache, v_cache, slot_mapping) but "
        "Kernels.write_kv_cache(self, k, v, k_cache, v_cache, slot_mapping, kv_scale=None)"
    ]
    assert signature_drift(Renamed()) == [
        "Renamed.rms_norm(self, x, w, eps) but Kernels.rms_norm(self, x, weight, eps)"
    ]
