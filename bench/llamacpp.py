"""llama.cpp baseline: a cached build of the llama-cpp-python sdist's vendored llama.cpp.

One cmake build under ``~/.cache/core-bench/`` (override with ``CORE_BENCH_CACHE``) gives
``llama-batched-bench``, ``llama-server`` and the shared ``libllama``; llama-cpp-python goes into its own
venv there with ``LLAMA_BUILD=OFF`` and loads that library through
``LLAMA_CPP_LIB_PATH``, so llama.cpp compiles once (several minutes on 2 cores) and the
project's venv never sees it. Nothing here runs in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from plugins.host import cpuinfo_features

PACKAGE = "llama-cpp-python"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_COMMON=ON",
]  # fmt: skip
# ggml's ISA switches and the /proc/cpuinfo flag each needs, for a build without its AMX path.
GGML_ISA_FLAGS = {
    "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma", "GGML_F16C": "f16c", "GGML_BMI2": "bmi2",
    "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
    "GGML_AVX512_BF16": "avx512_bf16", "GGML_AVX_VNNI": "avx_vnni",
}  # fmt: skip


def cache_dir() -> Path:
    return Path(os.environ.get("CORE_BENCH_CACHE", Path.home() / ".cache" / "core-bench"))


def build_config() -> tuple[str, list[str]]:
    """The cached build's folder name and its ggml ISA flags for this host.

    ``GGML_NATIVE`` everywhere but on CPUs with AMX tiles: there the native build compiles
    ggml's AMX path, and llama-bench, llama-server and llama-cpp-python all die with SIGSEGV
    once weights are repacked (llama-cpp-python 0.3.36's tree, seen on an Intel Xeon with
    AMX-INT8/BF16), so it is built for the host's AVX-512/VNNI/BF16 without AMX, in its own folder.
    """
    try:
        flags = cpuinfo_features(Path("/proc/cpuinfo").read_text())
    except OSError:
        flags = set()
    if "amx_tile" not in flags:
        return "build", ["-DGGML_NATIVE=ON"]
    isa = [f"-D{name}={'ON' if flag in flags else 'OFF'}" for name, flag in GGML_ISA_FLAGS.items()]
    return "build-noamx", ["-DGGML_NATIVE=OFF", *isa]


def run_logged(cmd: list[str], log: Path, **kwargs) -> None:
    """Run ``cmd`` with its output appended to ``log``; RuntimeError naming the log if it fails."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    if result.returncode:
        raise RuntimeError(f"{cmd[0]} failed with exit code {result.returncode}; see {log}")


def _sdist(cache: Path, log: Path) -> Path:
    found = sorted((cache / "sdist").glob("llama_cpp_python-*.tar.gz"))
    if not found:
        run_logged(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                PACKAGE,
                "-d",
                str(cache / "sdist"),
            ],
            log,
        )
        found = sorted((cache / "sdist").glob("llama_cpp_python-*.tar.gz"))
    return found[-1]


def ensure_llamacpp() -> dict[str, Any]:
    """Download, unpack and build once; return the paths of the cached pieces.

    Keys: ``bench`` (llama-batched-bench), ``server`` (llama-server), ``lib`` (the folder with libllama.so),
    ``python`` (the separate venv's interpreter, with llama-cpp-python), ``version``.
    """
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "setup.log"
    sdist = _sdist(cache, log)
    src = cache / "src" / sdist.name.removesuffix(".tar.gz")
    if not src.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(cache / "src", filter="data")
    folder, isa_flags = build_config()
    build = cache / folder
    bench, server, lib = build / "bin" / "llama-batched-bench", build / "bin" / "llama-server", build / "bin"
    if not bench.exists() or not server.exists() or not (lib / "libllama.so").exists():
        print(f"building llama.cpp from {sdist.name} into {build} (minutes; log: {log})", file=sys.stderr)
        cmake = ["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(build), *CMAKE_FLAGS, *isa_flags]
        run_logged(cmake, log)
        jobs = str(os.cpu_count() or 2)
        run_logged(
            ["cmake", "--build", str(build), "-j", jobs, "--target", "llama-batched-bench", "llama-server", "llama"],
            log,
        )
    venv = cache / "venv"
    python = venv / "bin" / "python"
    if (
        subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True, env=_lib_env(lib)).returncode
        if python.exists()
        else True
    ):
        run_logged([sys.executable, "-m", "venv", str(venv)], log)
        env = os.environ | {"CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}
        run_logged([str(python), "-m", "pip", "install", "--quiet", str(sdist)], log, env=env)
    return {
        "bench": bench,
        "server": server,
        "lib": lib,
        "python": python,
        "version": sdist.name.removesuffix(".tar.gz").split("-")[-1],
    }


def ensure_tools(*targets: str) -> dict[str, Path]:
    """llama.cpp's command-line tools (e.g. ``llama-bench``, ``llama-quantize``) in the cached
    build, each built once (nice, 2 jobs) after :func:`ensure_llamacpp` configured it."""
    build, log = ensure_llamacpp()["lib"].parent, cache_dir() / "setup.log"
    tools = {name: build / "bin" / name for name in targets}
    missing = [name for name, path in tools.items() if not path.exists()]
    if missing:
        print(f"building {' '.join(missing)} into {build} (minutes; log: {log})", file=sys.stderr)
        run_logged(["nice", "-n", "10", "cmake", "--build", str(build), "-j", "2", "--target", *missing], log)
    return tools


def _lib_env(lib: Path) -> dict[str, str]:
    return os.environ | {"LLAMA_CPP_LIB_PATH": str(lib)}


def batched_bench(
    bench: Path, model: str, threads: int, n_prompt: int, n_gen: int, parallel: list[int], extra: tuple[str, ...] = ()
) -> list[dict]:
    """Run llama-batched-bench once per parallel level (each with a context just big enough), with ``extra``
    arguments (e.g. ``("--lora", path)``); its jsonl rows."""
    rows = []
    for pl in parallel:
        cmd = [
            str(bench), "-m", model, "-c", str(pl * (n_prompt + n_gen) + 64), "-b", "2048", "-ub", "512",
            "-npp", str(n_prompt), "-ntg", str(n_gen), "-npl", str(pl), "-t", str(threads), "-tb", str(threads),
            "--output-format", "jsonl", *extra,
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"llama-batched-bench failed ({result.returncode}): {result.stderr[-2000:]}")
        found = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"n_kv_max"')]
        if not found:
            raise RuntimeError(f"llama-batched-bench printed no results: {result.stdout[-1000:]}")
        rows += found
    return rows


_DECODE = """
import json, sys, time
from llama_cpp import Llama
model, threads, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=512, verbose=False)
prompt = llm.tokenize(b"The history of the city begins", add_bos=True)
best = 0.0
for _ in range(2):
    llm.reset()
    stamps = []
    for _tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        if len(stamps) == n_gen + 1:
            break
    best = max(best, n_gen / (stamps[-1] - stamps[0]))
print(json.dumps({"decode_tok_s": best}))
"""


_GREEDY = """
import json, sys
from llama_cpp import Llama
model, threads, prompt, n_gen = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=512, verbose=False)
tokens = []
for tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
    tokens.append(tok)
    if len(tokens) == n_gen:
        break
print(json.dumps({"tokens": tokens}))
"""


def _python_json(python: Path, lib: Path, code: str, *args: str) -> dict:
    """Run ``code`` in the llama-cpp-python venv; the JSON object on its last line of output."""
    result = subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, env=_lib_env(lib))
    if result.returncode:
        raise RuntimeError(f"llama-cpp-python failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def python_decode(python: Path, lib: Path, model: str, threads: int, n_gen: int) -> float:
    """Batch-1 decode tok/s of llama-cpp-python (best of two runs; prefill excluded)."""
    return _python_json(python, lib, _DECODE, model, str(threads), str(n_gen))["decode_tok_s"]


def python_greedy(python: Path, lib: Path, model: str, threads: int, prompt: list[int], n_gen: int) -> list[int]:
    """The ``n_gen`` greedy token ids llama-cpp-python generates after ``prompt`` (EOS not special)."""
    return _python_json(python, lib, _GREEDY, model, str(threads), json.dumps(prompt), str(n_gen))["tokens"]
