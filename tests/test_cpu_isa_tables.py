"""The three CPU plugins' ISA tables (Python) against native/'s (C and CMake), and on this host.

Each plugin's :class:`plugins.cpu_native.library.IsaTable` names the variants its library
holds and the feature bits ``ck_cpu_features()`` returns; they must list the same variants
in the same order as native/src/features_<arch>.cpp and native/cpu_kernels.cmake, and the
same number of bits. On this machine's own plugin the library answers for itself:
``ck_isa_runs`` must agree with the table's requirements for every variant.
"""

from __future__ import annotations

import ctypes
import platform
import re
from pathlib import Path

import pytest
from plugin_cpu_arm.platform import ISA_TABLE as ARM
from plugin_cpu_x86.platform import ISA_TABLE as X86
from plugin_s390x.platform import ISA_TABLE as S390X
from plugins.cpu_native.library import cpu_features, library_path, load_library

NATIVE = Path(__file__).resolve().parents[1] / "native"
TABLES = {"x86_64": X86, "aarch64": ARM, "s390x": S390X}


@pytest.mark.parametrize("arch", sorted(TABLES))
def test_table_mirrors_native_sources(arch):
    table = TABLES[arch]
    source = (NATIVE / "src" / f"features_{arch}.cpp").read_text()
    c_isas = re.findall(r'\{"(\w+)",', source)
    cmake = re.search(rf"set\(CK_{arch}_ISAS ([\w ]+)\)", (NATIVE / "cpu_kernels.cmake").read_text()).group(1)
    assert list(table.requirements) == c_isas == cmake.split()
    assert list(table.choices["auto"]) == c_isas
    assert len(table.feature_bits) == len(re.findall(r"CK_HAS_\w+ = 1 << \d+", source))
    for isa, needs in table.requirements.items():
        assert set(needs) <= set(table.feature_bits), f"{arch} {isa} needs unknown features"


def test_host_library_agrees_with_its_table():
    table = TABLES.get(platform.machine())
    if table is None:
        pytest.skip(f"no CPU plugin for {platform.machine()}")
    library_path(table)  # fails naming the plugin when it was installed without its library
    lib = load_library(table)
    lib.ck_isa_runs.argtypes, lib.ck_isa_runs.restype = [ctypes.c_char_p], ctypes.c_int
    features = cpu_features(table, lib)
    for isa, needs in table.requirements.items():
        assert lib.ck_isa_runs(isa.encode()) == all(f in features for f in needs), isa
    lib.ck_isa_names.restype = ctypes.c_char_p
    assert lib.ck_isa_names().decode().split() == list(table.requirements)
