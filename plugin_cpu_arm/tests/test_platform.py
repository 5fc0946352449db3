"""Detection of aarch64 + NEON, from text, and on this machine."""

import platform

from plugin_cpu_arm.platform import CpuArmPlatform, probe

GRAVITON3 = (
    "processor\t: 0\nBogoMIPS\t: 2100.00\n"
    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
    "jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs "
    "paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng\n"
)
CORTEX_A72 = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"


def test_probe_graviton3_reports_isa():
    reason, flags = probe("aarch64", GRAVITON3)
    assert reason is None
    assert flags == {
        "neon": True,
        "fp16": True,
        "bf16": True,
        "dotprod": True,
        "i8mm": True,
        "sve": True,
        "sve2": False,
    }


def test_probe_cortex_a72_has_neon_only():
    reason, flags = probe("aarch64", CORTEX_A72)
    assert reason is None and flags["neon"] and not flags["fp16"] and not flags["bf16"]


def test_probe_rejects_other_machines_and_missing_neon():
    assert probe("x86_64", GRAVITON3)[0] == "host CPU is x86_64, not aarch64"
    assert "no 'asimd'" in probe("aarch64", "Features\t: fp evtstrm\n")[0]


def test_this_machine_never_raises():
    plat = CpuArmPlatform()
    available = plat.is_available()
    assert isinstance(available, bool)
    if platform.machine() != "aarch64":
        assert not available
        assert plat.unavailable_reason() == f"host CPU is {platform.machine()}, not aarch64"
    assert set(plat.device_info()["isa"]) >= {"neon", "fp16", "bf16", "sve"}


def test_identity():
    assert (CpuArmPlatform.name, CpuArmPlatform.device_type, CpuArmPlatform.priority) == ("cpu_arm", "cpu", 10)
