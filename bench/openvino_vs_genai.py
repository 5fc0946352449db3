"""plugin_openvino vs cpu_x86 vs openvino-genai's own pipeline on the default model (issue 42).

    .venv/bin/python bench/openvino_vs_genai.py [--rounds 3] [--threads 2]

Each round runs every configuration once, in a rotated order, each in a fresh process on the same
threads: batch-1 decode (``--n-gen`` tokens after a ``--decode-prompt-len`` prompt), ``--num-seqs``
x (``--prompt-len`` + ``--n-gen``) offline throughput, and one ``--prefill-len`` prompt's prefill,
on the same random token ids, prefix caching off, a 1 GiB KV cache. The configurations:
``openvino`` (``--device openvino``, float32, its defaults), ``openvino-bf16-u8`` (bfloat16 compute
and OpenVINO's u8 KV blocks, the precisions openvino-genai picks on a CPU with AVX512_BF16),
``openvino-genai-settings`` (those, and int8 activations in groups of 32 into the compressed-weight
products: openvino-genai's CPU defaults; the file's exact Q4_1 weights, in the split form int8
activations run), ``openvino-genai-settings-f16zp`` (the same with Q4_1's f16 zero points: exact too,
those products on float activations), ``openvino-genai-model`` (those, and Q4_1 zero points
rounded to 4-bit integers as openvino-genai's GGUF reader does: the model openvino-genai runs,
not the file's exact one), ``openvino-genai-model-f32`` (the same at float32 compute: what
``openvino-genai-f32`` runs),
``cpu_x86`` (float32), ``openvino-genai``: its ``LLMPipeline`` at its own CPU defaults (bf16
compute where the CPU has AVX512_BF16), reading the default GGUF itself, installed (the version
matching the installed openvino) in its own venv under the bench cache
(``~/.cache/core-bench/openvino-genai``, made on first use), and ``openvino-genai-f32``: the same at
``INFERENCE_PRECISION_HINT`` f32, the compute precision of plugin_openvino's exact default (it
keeps its u8 KV cache, int8 activations and rounded Q4_1 zero points: like for like with
``openvino-genai-model-f32``). Prints a table of
medians and the per-round ratios (each plugin_openvino configuration against both openvino-genai
runs: the row at its own compute precision is marked "same compute precision"); ``--json`` saves every round; ``--configs`` runs a subset;
``--phases`` adds where a plugin_openvino batch-1 decode step's time goes (:func:`decode_phases`).
Not for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llamacpp import cache_dir  # noqa: E402

HERE = Path(__file__).resolve().parent
#: configuration -> (core's device, dtype, extra environment); openvino-genai runs in its own venv
CORE_CONFIGS = {
    "openvino": ("openvino", "float32", {}),
    "openvino-bf16-u8": ("openvino", "bfloat16", {"CORE_OPENVINO_CPU_KV_CACHE_PRECISION": "u8"}),
    "openvino-genai-settings": (
        "openvino",
        "bfloat16",
        {"CORE_OPENVINO_CPU_KV_CACHE_PRECISION": "u8", "CORE_OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"},
    ),
    "openvino-genai-settings-f16zp": (
        "openvino",
        "bfloat16",
        {
            "CORE_OPENVINO_CPU_KV_CACHE_PRECISION": "u8",
            "CORE_OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE": "32",
            "CORE_OPENVINO_Q4_1_SPLIT": "0",
        },
    ),
    "openvino-genai-model": (
        "openvino",
        "bfloat16",
        {
            "CORE_OPENVINO_CPU_KV_CACHE_PRECISION": "u8",
            "CORE_OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE": "32",
            "CORE_OPENVINO_Q4_1_INTEGER_ZERO_POINTS": "1",
        },
    ),
    "openvino-genai-model-f32": (
        "openvino",
        "float32",
        {
            "CORE_OPENVINO_CPU_KV_CACHE_PRECISION": "u8",
            "CORE_OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE": "32",
            "CORE_OPENVINO_Q4_1_INTEGER_ZERO_POINTS": "1",
        },
    ),
    "cpu_x86": ("cpu_x86", "float32", {}),
}
#: openvino-genai's configurations -> the INFERENCE_PRECISION_HINT it is given (None: the CPU's default)
GENAI_CONFIGS = {"openvino-genai": None, "openvino-genai-f32": "f32"}
CONFIGS = (*CORE_CONFIGS, *GENAI_CONFIGS)
METRICS = ("decode_tok_s", "output_tok_s", "prefill_tok_s")


def ensure_genai() -> Path:
    """openvino-genai (and openvino-tokenizers) of the installed openvino's version in their own venv; its python."""
    root = cache_dir() / "openvino-genai"
    ov_version = version("openvino")
    python = root / "venv" / "bin" / "python"
    probe = f"import openvino_genai, openvino; assert openvino.__version__.startswith('{ov_version}')"
    if python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0:
        return python
    root.mkdir(parents=True, exist_ok=True)
    print(f"installing openvino-genai {ov_version} into {root / 'venv'}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"openvino=={ov_version}",
                    f"openvino-genai=={ov_version}.0", f"openvino-tokenizers=={ov_version}.0"], check=True)  # fmt: skip
    return python


def workload(args: argparse.Namespace) -> dict:
    """The token ids every configuration runs (random, no special tokens: SmolLM2's are below 256)."""
    import numpy as np

    rng = np.random.default_rng(args.seed)

    def draw(n: int, length: int) -> list[list[int]]:
        return rng.integers(256, 49152, (n, length)).tolist()

    return {"prompt": draw(1, args.decode_prompt_len)[0], "prompts": draw(args.num_seqs, args.prompt_len),
            "prefill_prompt": draw(1, args.prefill_len)[0], "n_gen": args.n_gen, "threads": args.threads,
            "kv_cache_gib": 1, "phases": args.phases}  # fmt: skip


#: a batch-1 decode step's phases (``--phases``), in the order the table prints them
PHASES = ("step", "main_infer", "runner_io", "lm_head_infer", "logits_io", "core_python")


class _TimedRequest:
    """An OpenVINO infer request whose ``infer()`` calls add their seconds to ``times[key]``."""

    def __init__(self, request: Any, times: dict, key: str) -> None:
        self._request, self._times, self._key = request, times, key

    def infer(self) -> None:
        start = time.perf_counter()
        self._request.infer()
        self._times[self._key] += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def decode_phases(llm: Any, prompt: list[int], n_gen: int) -> dict:
    """Milliseconds of a batch-1 decode step (mean over ``n_gen`` steps; prefill excluded) by phase,
    plugin_openvino's runner instrumented: ``main_infer`` (the decoder's compiled model, the LM
    head's product on the sampled rows included), ``runner_io`` (the rest of ``forward``: the
    step's inputs into OpenVINO, its hidden states and logits out), ``lm_head_infer`` (the LM
    head's own compiled model: rows the main infer did not compute, none in a plain decode),
    ``logits_io`` (the rest of ``compute_logits``) and ``core_python`` (the rest of ``engine.step``: scheduler, sampler,
    detokenizer, outputs)."""
    from core import SamplingParams

    engine = llm.engine
    runner = engine.executor.runner.runner
    times = dict.fromkeys(("main_infer", "lm_head_infer", "forward", "logits"), 0.0)
    runner.request = _TimedRequest(runner.request, times, "main_infer")
    runner._lm_head = _TimedRequest(runner._lm_head, times, "lm_head_infer")
    forward, logits = runner.forward, runner.compute_logits

    def timed(method: Any, key: str) -> Any:
        def call(*args: Any) -> Any:
            start = time.perf_counter()
            out = method(*args)
            times[key] += time.perf_counter() - start
            return out

        return call

    runner.forward, runner.compute_logits = timed(forward, "forward"), timed(logits, "logits")
    engine.add_request("phases", params=SamplingParams(temperature=0.0, max_tokens=1), prompt_token_ids=prompt)
    while engine.has_unfinished_requests():  # the prefill, not counted
        engine.step()
    for key in times:
        times[key] = 0.0
    engine.add_request("phases-decode", params=SamplingParams(temperature=0.0, max_tokens=n_gen, ignore_eos=True),
                       prompt_token_ids=prompt)  # fmt: skip
    engine.step()  # its prefill
    for key in times:
        times[key] = 0.0
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    step = (time.perf_counter() - start) / steps
    ms = {key: 1e3 * value / steps for key, value in times.items()}
    return {"step": 1e3 * step, "main_infer": ms["main_infer"], "runner_io": ms["forward"] - ms["main_infer"],
            "lm_head_infer": ms["lm_head_infer"], "logits_io": ms["logits"] - ms["lm_head_infer"],
            "core_python": 1e3 * step - ms["forward"] - ms["logits"]}  # fmt: skip


def core_part(spec: dict, config: str) -> dict:
    """``core.LLM`` of ``config`` (prefix caching off): the three figures."""
    import engine_part

    from core import LLM, SamplingParams

    device, dtype, _ = CORE_CONFIGS[config]
    start = time.perf_counter()
    llm = LLM(device=device, dtype=dtype, enable_prefix_caching=False, max_num_batched_tokens=2048,
              kv_cache_bytes=spec["kv_cache_gib"] << 30)  # fmt: skip
    out = {
        "load_s": time.perf_counter() - start,
        "platform": llm.engine.platform.name,
        "precision": {"float32": "f32", "bfloat16": "bf16"}[dtype],
    }
    out["decode_tok_s"] = engine_part.decode_tok_s(llm, spec["prompt"], spec["n_gen"])
    params = SamplingParams(temperature=0.0, max_tokens=spec["n_gen"], ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompt_token_ids=spec["prompts"], sampling_params=params, use_tqdm=False)
    out["output_tok_s"] = len(spec["prompts"]) * spec["n_gen"] / (time.perf_counter() - start)
    out["prefill_tok_s"] = engine_part.prefill_tok_s(llm, spec["prefill_prompt"])
    if spec["phases"] and device == "openvino":
        out["phases_ms"] = decode_phases(llm, spec["prompt"], spec["n_gen"])
    llm.shutdown()
    return out


def run_config(config: str, spec_path: str, threads: int, genai_python: Path | None, model: str) -> dict:
    """One configuration in a fresh process on CPUs ``0..threads-1``; its RESULT."""
    pin = ["taskset", "-c", f"0-{threads - 1}"]
    if config in GENAI_CONFIGS:
        precision = GENAI_CONFIGS[config]
        cmd = [*pin, str(genai_python), str(HERE / "openvino_genai_worker.py"), spec_path, model]
        cmd += [] if precision is None else [precision]
        env = os.environ
    else:
        cmd = [*pin, sys.executable, str(Path(__file__).resolve()), "--part", config, "--spec", spec_path]
        env = os.environ | CORE_CONFIGS[config][2]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{config} failed (exit code {proc.returncode}); its stderr is above")


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def report(rounds: list[dict], args: argparse.Namespace, configs: tuple[str, ...]) -> str:
    """A markdown table: each configuration's median figures, then the median per-round ratio of
    each plugin_openvino configuration to each openvino-genai configuration (marked "same
    compute precision" where both computed at the same ``INFERENCE_PRECISION_HINT``) and to cpu_x86."""
    workload = f"{args.num_seqs}x({args.prompt_len}+{args.n_gen})"
    lines = [
        f"| configuration | batch-1 decode tok/s | {workload} output tok/s | {args.prefill_len}-token prefill tok/s |",
        "|---|---|---|---|",
    ]
    for config in configs:
        cells = [f"{statistics.median(r[config][m] for r in rounds):.1f}" for m in METRICS]
        lines.append(f"| {config} ({rounds[0][config]['precision']}) | {' | '.join(cells)} |")
    for ours in [c for c in configs if c in CORE_CONFIGS and c.startswith("openvino")]:
        for other in [c for c in (*GENAI_CONFIGS, "cpu_x86") if c in configs]:
            cells = [f"{statistics.median(r[ours][m] / r[other][m] for r in rounds):.2f}x" for m in METRICS]
            same = other in GENAI_CONFIGS and rounds[0][ours]["precision"] == rounds[0][other]["precision"]
            label = f"{ours} / {other} ({'same compute precision, ' if same else ''}median of per-round ratios)"
            lines.append(f"| {label} | {' | '.join(cells)} |")
    phased = [c for c in configs if all("phases_ms" in r[c] for r in rounds)]
    if phased:
        lines += ["", "| batch-1 decode step, ms (medians) | " + " | ".join(PHASES) + " |",
                  "|---|" + "---|" * len(PHASES)]  # fmt: skip
        for config in phased:
            cells = [f"{statistics.median(r[config]['phases_ms'][p] for r in rounds):.3f}" for p in PHASES]
            lines.append(f"| {config} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--n-gen", type=int, default=128)
    p.add_argument("--decode-prompt-len", type=int, default=16)
    p.add_argument("--num-seqs", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma-separated configurations to run (default: all of {', '.join(CONFIGS)})")  # fmt: skip
    p.add_argument("--phases", action="store_true",
                   help="also time a batch-1 decode step's phases in each plugin_openvino configuration")  # fmt: skip
    p.add_argument("--json", type=Path, help="save every round's figures here")
    p.add_argument("--part", choices=list(CORE_CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    configs = tuple(args.configs.split(","))
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configurations {unknown}; choose from {', '.join(CONFIGS)}")
    if args.part:
        with open(args.spec) as f:
            print("RESULT " + json.dumps(core_part(json.load(f), args.part)), flush=True)
        return 0
    from core.loader.source import default_model_path

    genai_python = ensure_genai() if any(c in GENAI_CONFIGS for c in configs) else None
    rounds = []
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec:
        json.dump(workload(args), spec)
        spec.flush()
        for r in range(args.rounds):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            figures = {"load_before": load_average()}
            for config in order:
                figures[config] = run_config(config, spec.name, args.threads, genai_python, str(default_model_path()))
                print(f"round {r + 1} {config}: {figures[config]}", file=sys.stderr)
            rounds.append(figures)
    print(report(rounds, args, configs))
    print(f"threads {args.threads}; load averages before each round: {[r['load_before'] for r in rounds]}")
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
