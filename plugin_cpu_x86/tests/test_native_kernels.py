"""The kernel library's own C++ tests (native/tests/test_kernels.cpp) on this host.

make test-cross runs them on the emulated aarch64 and s390x CPUs; here the same program is
compiled with the host's compiler and run against the library this plugin installed, so
every x86 ISA path the CPU has (AMX, AVX-512 BF16 / VNNI, AVX-512, AVX2, scalar) is checked
against its scalar double-precision reference, with the shapes the Python tests do not
reach (partial groups of the x8 layout, AMX tile passes, fused MoE work items).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "native" / "tests" / "test_kernels.cpp"


def test_kernel_library_against_scalar_reference(tmp_path: Path) -> None:
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH (the plugin's build needs one: install g++)")
    library = importlib.util.find_spec("plugin_cpu_x86._cx86").origin
    program = tmp_path / "test_kernels"
    subprocess.run(
        [compiler, "-O2", "-std=c++17", "-o", str(program), str(SOURCE), "-ldl"],
        check=True,
        capture_output=True,
        text=True,
    )
    run = subprocess.run([str(program), library], capture_output=True, text=True, timeout=600)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, f"{summary}\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
    assert "passed" in summary and "ISA paths run" in summary, summary
