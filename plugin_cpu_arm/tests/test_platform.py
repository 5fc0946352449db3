"""Detection of aarch64 + NEON, from text, and on this machine."""

import platform

from plugin_cpu_arm.platform import CpuArmPlatform, hwcap_features, probe
from plugins.host import cpuinfo_features

GRAVITON3 = (
    "processor\t: 0\nBogoMIPS\t: 2100.00\n"
    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
    "jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs "
    "paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng\n"
)
CORTEX_A72 = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"


def test_probe_graviton3_reports_isa():
    reason, flags = probe("aarch64", cpuinfo_features(GRAVITON3))
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
    reason, flags = probe("aarch64", cpuinfo_features(CORTEX_A72))
    assert reason is None and flags["neon"] and not flags["fp16"] and not flags["bf16"]


def test_probe_rejects_other_machines_and_missing_neon():
    assert probe("x86_64", cpuinfo_features(GRAVITON3))[0] == "host CPU is x86_64, not aarch64"
    assert "no 'asimd'" in probe("aarch64", cpuinfo_features("Features\t: fp evtstrm\n"))[0]


def test_hwcaps_named_as_cpuinfo():
    """Graviton 3's hwcap words (its first 23 /proc/cpuinfo names are AT_HWCAP bits 0-22, in order)."""
    names = GRAVITON3.split("Features\t: ")[1].split()
    hwcap = sum(1 << i for i in range(23))
    assert names[22] == "sve"
    hwcap2 = 1 << 13 | 1 << 14  # i8mm, bf16 (sve2 off)
    assert hwcap_features(hwcap, hwcap2) == {"asimd", "asimdhp", "asimddp", "sve", "i8mm", "bf16"}
    assert probe("aarch64", hwcap_features(hwcap, hwcap2)) == probe("aarch64", cpuinfo_features(GRAVITON3))


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


def test_kernel_isa_from_flags_or_why_not():
    """The variant CPU_KERNEL_ISA picks from the probed flags; off aarch64 (no library) the reason."""
    plat = CpuArmPlatform()
    isa = plat.device_info()["kernel_isa"]
    if platform.machine() != "aarch64":
        assert isa.startswith("unavailable: plugin_cpu_arm's native library _carm.so is missing")
        return
    assert isa in ("neon_bf16", "neon_dotprod", "neon", "scalar")
    assert plat.is_available()
