"""Detection of s390x + vector extensions, from text, and on this machine."""

import platform

import pytest
from plugin_s390x.platform import S390xPlatform, probe

Z15 = (
    "vendor_id       : IBM/S390\n# processors    : 4\nbogomips per cpu: 3241.00\n"
    "features\t: esan3 zarch stfle msa ldisp eimm dfp edat etf3eh highgprs te vx vxd vxe gs vxe2 vxp sort dflt sie\n"
    "processor 0: version = 00,  identification = 2A1B38,  machine = 8561\n"
)
Z13 = (
    "vendor_id       : IBM/S390\n"
    "features\t: esan3 zarch stfle msa ldisp eimm dfp edat etf3eh highgprs te vx sie\n"
    "processor 0: version = 00,  identification = 0A1B38,  machine = 2964\n"
)


def test_probe_z15():
    reason, info = probe("s390x", Z15)
    assert reason is None
    assert info == {"vx": True, "vxe": True, "vxe2": True, "nnpa": False, "machine": "z15"}


def test_probe_z13_lacks_vxe():
    reason, info = probe("s390x", Z13)
    assert reason == "s390x CPU (z13) without vector enhancements 'vxe': z14 or later needed"
    assert info["vx"] and not info["vxe"]


def test_probe_rejects_other_machines_and_no_vector_facility():
    assert probe("x86_64", Z15)[0] == "host CPU is x86_64, not s390x"
    assert "no 'vx'" in probe("s390x", "features\t: esan3 zarch\n")[0]


def test_this_machine_never_raises():
    plat = S390xPlatform()
    if platform.machine() != "s390x":
        assert plat.is_available() is False
        assert plat.unavailable_reason() == f"host CPU is {platform.machine()}, not s390x"
    info = plat.device_info()
    assert info["byte_order"] == "big" and set(info["isa"]) == {"vx", "vxe", "vxe2", "nnpa"}


def test_check_config_float32_only():
    class Config:
        dtype = "bfloat16"

    with pytest.raises(ValueError, match="float32 only, got dtype='bfloat16'"):
        S390xPlatform().check_config(Config())
    Config.dtype = "auto"
    assert S390xPlatform().check_config(Config()) == {}


def test_identity():
    assert (S390xPlatform.name, S390xPlatform.device_type, S390xPlatform.priority) == ("s390x", "cpu", 10)


def test_kernel_isa_from_flags_or_why_not():
    """The variant CPU_KERNEL_ISA picks from the probed flags; off s390x (no library) the reason."""
    plat = S390xPlatform()
    isa = plat.device_info()["kernel_isa"]
    if platform.machine() != "s390x":
        assert isa.startswith("unavailable: plugin_s390x's native library _cs390x.so is missing")
        return
    assert isa in ("z15", "z14", "scalar")
