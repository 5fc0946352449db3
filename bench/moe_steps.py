"""Per-step times of Qwen3-MoE models on the CPU: the fused native decoder against the eager forward.

    python bench/moe_steps.py [--models tiny,bench,bench-q8,bench-q4] [--rounds 5] [--decode-steps 32]

Three ways through each model, in one invocation, alternating within each round:

* ``fused``: every step one native call (native/src/decode.cpp: q/k head norms, the router, its
  softmax and top-k and the experts of native/src/moe.cpp inside the layer loop);
* ``eager``: the model's Python forward, one native kernel call at a time (the experts through
  ``NativeCpuKernels.fused_moe``, the same native kernel);
* ``eager-torch``: the eager forward with the SDK's grouped torch experts (``Kernels.prepare_experts``
  and ``fused_moe``: what MoE layers ran before the native kernel; a second process, loaded once).

Workloads: batch-1 decode steps after a 16-token prompt, decode steps of 16 sequences, and one
128-token prompt's prefill step; each the median step time of a round (ms). Models: ``tiny``, a
Qwen3-MoE of the test families' proportions made here (hidden 256, 4 layers, 8 experts of 256, top
2); ``bench``, bench/moe.py's ~1B float32 folder (hidden 1024, 24 layers, 8 experts of 1536, top 2;
made by bench/moe.py's ``ensure_model`` when missing); ``bench-q8`` and ``bench-q4``, its Q8_0 and
Q4_0 GGUF files made by bench/moe.py (``--formats Q8_0,Q4_0``), each skipped when missing. Each figure is the median over rounds;
ratios are the median of the per-round ratios. Not for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TINY = dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, intermediate_size=512,
    decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=True,
    max_position_embeddings=1024, vocab_size=8192,
)  # fmt: skip
WAYS = ("fused", "eager", "eager-torch")
WORKLOADS = ("decode-1", "decode-16", "prefill-128")


def tiny_model() -> Path:
    """The tiny Qwen3-MoE folder (random weights, seed 0), made once in the bench cache."""
    import llamacpp

    out = llamacpp.cache_dir() / "moe-steps-tiny"
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**TINY))
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tmp.rename(out)
    return out


def model_path(name: str) -> Path | None:
    if name == "tiny":
        return tiny_model()
    import moe

    folder = moe.ensure_model()
    if name == "bench":
        return folder
    formats = {"bench-q8": "Q8_0", "bench-q4": "Q4_0"}
    if name not in formats:
        raise SystemExit(f"--models: unknown model {name!r} (tiny, bench, {', '.join(formats)})")
    path = folder.parent / f"{folder.name}.{formats[name]}.gguf"
    return path if path.exists() else None


# -- a worker process: one model loaded once, timing steps on request -----------------------------


def step_times(llm, prompts: list[list[int]], steps: int) -> list[float]:
    """Wall time of each engine step (s) that runs ``prompts`` (prefill first) for ``steps`` decode steps."""
    from core.sampling_params import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", params=params, prompt_token_ids=prompt)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times


def worker_main(path: str, torch_experts: bool) -> None:
    """Answer ``{"way": ..., "steps": n}`` lines on stdin with ``{workload: median ms}``."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # libraries' prints go to stderr: stdout carries the answers
    if torch_experts:  # the SDK's grouped torch default, as before native/src/moe.cpp
        from plugins.cpu_native.kernels import NativeCpuKernels
        from plugins.kernels import Kernels

        NativeCpuKernels.prepare_experts = Kernels.prepare_experts
        NativeCpuKernels.fused_moe = Kernels.fused_moe
    from core import LLM

    llm = LLM(path, device="auto", dtype="float32", quantization="gguf" if path.endswith(".gguf") else None,
              enable_prefix_caching=False, max_num_batched_tokens=2048, max_model_len=1024, kv_cache_bytes=256 << 20,
              skip_tokenizer_init=True)  # fmt: skip
    runner = llm.engine.executor.runner.runner
    fused = runner.fused
    out.write(json.dumps({"ready": True, "fused": fused is not None}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        runner.fused = fused if request["way"] == "fused" else None
        steps = request["steps"]
        one = step_times(llm, [list(range(100, 116))], steps)[1:]
        many = step_times(llm, [list(range(100 + i, 116 + i)) for i in range(16)], steps)[1:]
        prefill = step_times(llm, [list(range(1, 129))], 1)[0]
        result = {"decode-1": statistics.median(one) * 1e3, "decode-16": statistics.median(many) * 1e3,
                  "prefill-128": prefill * 1e3}  # fmt: skip
        out.write(json.dumps(result) + "\n")
        out.flush()


class Worker:
    def __init__(self, path: Path, torch_experts: bool) -> None:
        args = [sys.executable, __file__, "--worker", str(path)] + (["--torch-experts"] if torch_experts else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = json.loads(self.proc.stdout.readline())

    def ask(self, way: str, steps: int) -> dict[str, float]:
        self.proc.stdin.write(json.dumps({"way": way, "steps": steps}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def bench_model(name: str, path: Path, rounds: int, steps: int) -> dict[str, dict[str, list[float]]]:
    """``{way: {workload: [ms a round]}}``, the ways alternating within each round."""
    native, torch_side = Worker(path, False), Worker(path, True)
    try:
        if not native.ready["fused"]:
            raise SystemExit(f"{name}: the fused decoder does not run {path} (see the worker's log)")
        times: dict[str, dict[str, list[float]]] = {way: {w: [] for w in WORKLOADS} for way in WAYS}
        for way in WAYS:  # warm-up
            (torch_side if way == "eager-torch" else native).ask("eager" if way == "eager-torch" else way, 2)
        for r in range(rounds):
            for way in WAYS[r % 2 :] + WAYS[: r % 2]:
                worker = torch_side if way == "eager-torch" else native
                got = worker.ask("eager" if way == "eager-torch" else way, steps)
                for workload, ms in got.items():
                    times[way][workload].append(ms)
            print(f"{name} round {r + 1}: " + ", ".join(f"{way} {times[way]['decode-1'][-1]:.2f} ms" for way in WAYS)
                  + f" (batch-1 decode step); load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        return times
    finally:
        native.close()
        torch_side.close()


def report(name: str, times: dict[str, dict[str, list[float]]]) -> str:
    lines = [f"| {name} | " + " | ".join(WAYS) + " | eager / fused | eager-torch / fused |", "|---" * 6 + "|"]
    for workload in WORKLOADS:
        med = {way: statistics.median(times[way][workload]) for way in WAYS}
        ratios = [statistics.median(a / f for a, f in zip(times[way][workload], times["fused"][workload], strict=True))
                  for way in ("eager", "eager-torch")]  # fmt: skip
        lines.append(f"| {workload} step, ms | " + " | ".join(f"{med[way]:.2f}" for way in WAYS)
                     + f" | {ratios[0]:.2f}x | {ratios[1]:.2f}x |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,bench,bench-q8,bench-q4")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--torch-experts", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(args.worker, args.torch_experts)
        return 0
    from floors import machine_info

    print(machine_info(), flush=True)
    tables = []
    for name in args.models.split(","):
        path = model_path(name)
        if path is None:
            print(f"{name}: no model file (run bench/moe.py --formats Q8_0,Q4_0 first); skipped", flush=True)
            continue
        tables.append(report(name, bench_model(name, path, args.rounds, args.decode_steps)))
        print(tables[-1], flush=True)
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
