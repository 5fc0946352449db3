"""Intel's selector variables: ONEAPI_DEVICE_SELECTOR, ZE_AFFINITY_MASK, and XPU_VISIBLE_DEVICES."""

import pytest
from plugin_xpu.selectors import (
    device_env,
    parse_affinity_mask,
    parse_selector,
    selector_hides_gpus,
    selector_reason,
)


def test_selector_terms():
    assert parse_selector("level_zero:0,1") == [(False, "level_zero", ["0", "1"])]
    assert parse_selector("!opencl:*; level_zero:gpu") == [(True, "opencl", ["*"]), (False, "level_zero", ["gpu"])]
    assert parse_selector("*:0.1") == [(False, "*", ["0.1"])]
    for bad in ("level_zero", "vulkan:0", "level_zero:first", "level_zero:", ";", ""):
        with pytest.raises(ValueError, match="ONEAPI_DEVICE_SELECTOR"):
            parse_selector(bad)


@pytest.mark.parametrize(
    ("selector", "hides"),
    [
        ("level_zero:gpu", False),
        ("level_zero:1", False),
        ("*:*", False),
        ("!opencl:*", False),  # only exclusions: *:* implied, Level Zero GPUs stay
        ("!level_zero:1", False),  # one GPU removed, others stay
        ("opencl:gpu", True),  # torch.xpu runs on Level Zero only
        ("level_zero:cpu", True),
        ("*:cpu", True),
        ("!level_zero:*", True),
        ("level_zero:0;!*:gpu", True),
    ],
)
def test_which_selectors_leave_torch_a_gpu(selector, hides):
    assert selector_hides_gpus(selector) is hides


def test_affinity_mask():
    assert parse_affinity_mask("0,1.1") == ["0", "1.1"]
    assert parse_affinity_mask("") == []  # Level Zero: empty means every device
    with pytest.raises(ValueError, match=r"ZE_AFFINITY_MASK='0,x': 'x' is not a device index"):
        parse_affinity_mask("0,x")
    with pytest.raises(ValueError, match="lists a device twice"):
        parse_affinity_mask("1,1")


def test_selector_reason_names_the_variable():
    assert selector_reason({}) is None
    assert selector_reason({"ONEAPI_DEVICE_SELECTOR": "level_zero:0", "ZE_AFFINITY_MASK": "0"}) is None
    assert selector_reason({"ONEAPI_DEVICE_SELECTOR": "opencl:gpu"}).startswith(
        "ONEAPI_DEVICE_SELECTOR='opencl:gpu' leaves no Level Zero GPU"
    )
    assert "is not [!]backend:devices" in selector_reason({"ONEAPI_DEVICE_SELECTOR": "gpu"})
    assert "'a' is not a device index" in selector_reason({"ZE_AFFINITY_MASK": "a"})


def test_visible_devices_export():
    assert device_env(None, {"ZE_AFFINITY_MASK": "3"}) == {}
    assert device_env("0,1", {}) == {"ZE_AFFINITY_MASK": "0,1"}
    assert device_env("0.1", {"ZE_AFFINITY_MASK": "0.1"}) == {"ZE_AFFINITY_MASK": "0.1"}
    with pytest.raises(ValueError, match="conflicts with ZE_AFFINITY_MASK='1'"):
        device_env("0", {"ZE_AFFINITY_MASK": "1"})
    with pytest.raises(ValueError, match="XPU_VISIBLE_DEVICES='gpu0'"):
        device_env("gpu0", {})
