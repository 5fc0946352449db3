"""This engine vs Hugging Face transformers on one NVIDIA GPU, in one invocation.

    python bench/cuda_vs_transformers.py --json cuda.json   # Qwen2-0.5B shape, random bf16 weights, no download
    python bench/cuda_vs_transformers.py --check            # plugin_cuda's tests + greedy parity vs the reference
    python bench/cuda_vs_transformers.py --tiny --device cpu_x86 --dtype float32   # the same code on a CPU

Parts run in subprocesses, each with the device to itself (a part that fails is reported, the
others still run): ``prepare`` (copy bandwidth, matmul rate, the random-weight model written
to a folder), this engine with CUDA graphs, this engine with ``enforce_eager``, and transformers
``generate``. Batch-1 decode: 256 tokens after the first over the time since the first (greedy,
EOS ignored, best of two, after a warm-up). Prefill: N prompts, one output token each. Batched:
N x (prompt + gen) random-token prompts (the same for both systems), generated tok/s incl. prefill.
Floors: weight bytes / copy bandwidth per decode step; prefill FLOPs / matmul rate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from plugins.reference import TINY_MODEL

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: Qwen2-0.5B's published config (494M parameters, tied embeddings)
QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1000000.0,
             "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "bos_token_id": 151643, "eos_token_id": 151643}  # fmt: skip
#: SmolLM2-135M-Instruct's config (the default model's shape: Llama, 30 layers, tied embeddings)
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True, "rope_theta": 100000.0,
                "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
#: --tiny: the SDK's tiny decoder, tied, with a longer context
TINY = {**TINY_MODEL, "vocab_size": 512, "tie_word_embeddings": True, "max_position_embeddings": 1024,
        "initializer_range": 0.2}  # fmt: skip
#: sizes of a full run and of --tiny: decode tokens, concurrency, prompt, generated, copy MiB, matmul sizes
SIZES = {"full": (256, 64, 128, 256, 1024, (4096, 8192)), "tiny": (16, 4, 16, 16, 64, (256, 512))}


def _platform(name: str):
    from core.discovery import discover, select_platform

    return select_platform(name, discover())


def require_device(name: str) -> None:
    """Exit with the reason when ``name`` cannot run here (before any model is built)."""
    from plugins import PlatformUnavailable

    try:
        plat = _platform(name)
    except PlatformUnavailable as exc:
        raise SystemExit(f"cuda_vs_transformers: device {name!r} is not usable here: {exc}\n"
                         "Run it on an NVIDIA GPU machine (plugin_cuda/GPU_CHECKLIST.md), or try the code "
                         "path on a CPU: --tiny --device cpu_x86 --dtype float32") from None  # fmt: skip
    if plat.device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"cuda_vs_transformers: torch {torch.__version__} sees no CUDA device")


def _timed(fn, sync, repeats: int) -> float:
    fn()
    sync()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def part_prepare(a: argparse.Namespace) -> dict:
    """Copy bandwidth and matmul rate on the device; the random-weight model saved to ``a.model_dir``."""
    import torch
    from floors import ModelShape
    from transformers import Qwen2Config, Qwen2ForCausalLM

    plat = _platform(a.device)
    dev, sync, dtype = plat.torch_device(), plat.synchronize, getattr(torch, a.dtype)
    src = torch.ones(a.copy_mib * (1 << 20) // 4, device=dev)
    dst = src.clone()
    bandwidth = 2 * src.nbytes / _timed(lambda: dst.copy_(src), sync, 10)  # bytes read + written
    mats = [torch.randn(n, n, device=dev, dtype=dtype) for n in a.matmul_sizes]
    rate = max(2 * x.shape[0] ** 3 / _timed(lambda x=x: x @ x, sync, 10) for x in mats)
    torch.manual_seed(a.seed)
    config = Qwen2Config(**(TINY if a.tiny else QWEN2_05B))
    with torch.device(dev):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(a.model_dir)
    weights = [p for p in model.parameters() if p.dim() > 1]  # tied embedding counted once
    shape = ModelShape(file_bytes=sum(p.nbytes for p in weights), params=sum(p.numel() for p in weights),
                       embed_params=config.vocab_size * config.hidden_size, tied=config.tie_word_embeddings,
                       num_layers=config.num_hidden_layers, attn_width=config.hidden_size,
                       kv_width=config.num_key_value_heads * (config.hidden_size // config.num_attention_heads))  # fmt: skip
    return {"bandwidth_gb_s": bandwidth / 1e9, "matmul_tflop_s": rate / 1e12, "matmul_sizes": a.matmul_sizes,
            "shape": shape.__dict__, "device_info": plat.device_info(), "torch": torch.__version__}  # fmt: skip


def _prompts(a: argparse.Namespace, vocab: int) -> dict[str, list[list[int]]]:
    """The same token-id prompts for both systems (``batch`` equals ``run_throughput``'s)."""
    from core.bench.stats import random_prompts

    return {"decode": random_prompts(1, 8, vocab, a.seed)[0:1], "batch": random_prompts(a.num_seqs, a.prompt_len, vocab, a.seed),
            "warm": random_prompts(a.num_seqs, a.prompt_len, vocab, a.seed + 1),
            "prefill": random_prompts(a.num_seqs, a.prompt_len, vocab, a.seed + 2)}  # fmt: skip


def part_engine(a: argparse.Namespace) -> dict:
    """This engine: batch-1 decode, prefill rate (best of 3) and N-way throughput, graphs on or off
    (``a.eager``), decode products on the skinny-GEMM choice or cuBLAS only (``a.cublas``)."""
    import os

    import engine_part
    from core.bench.throughput import run_throughput

    from core import LLM, SamplingParams

    if a.cublas:
        os.environ["CORE_CUDA_SKINNY_GEMM"] = "cublas"
    llm = LLM(model=a.model_dir, device=a.device, dtype=a.dtype, skip_tokenizer_init=True, enforce_eager=a.eager,
              enable_prefix_caching=False, max_num_seqs=a.num_seqs, seed=a.seed,
              max_model_len=a.prompt_len + max(a.gen_len, a.decode_tokens) + 8)  # fmt: skip
    p = _prompts(a, llm.engine.loaded.hf_config.vocab_size)
    result = {"decode_tok_s": engine_part.decode_tok_s(llm, p["decode"][0], a.decode_tokens),
              "weights_bytes": llm.engine.loaded.weights_bytes, "platform": llm.engine.platform.name}  # fmt: skip
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate(prompt_token_ids=p["warm"], sampling_params=one.clone(max_tokens=4), use_tqdm=False)
    seconds = _timed(lambda: llm.generate(prompt_token_ids=p["prefill"], sampling_params=one, use_tqdm=False),
                     llm.engine.platform.synchronize, 3)  # fmt: skip
    result["prefill_tok_s"] = a.num_seqs * a.prompt_len / seconds
    tp = run_throughput(llm, a.num_seqs, a.prompt_len, a.gen_len, a.seed)
    result.update(output_tok_s=tp.output_tok_s, throughput=tp.as_dict())
    choices = getattr(llm.engine.platform.kernels, "skinny_choices", None)
    if choices is not None:
        result["skinny_gemm"] = choices
    return result


def part_hf(a: argparse.Namespace) -> dict:
    """transformers ``generate`` on the same weights and device: batch 1, prefill, N prompts left-padded."""
    import torch
    from transformers import AutoModelForCausalLM

    plat = _platform(a.device)
    dev, sync = plat.torch_device(), plat.synchronize
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=getattr(torch, a.dtype)).to(dev).eval()
    p = _prompts(a, model.config.vocab_size)

    def batch(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, prompts))
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = torch.tensor(prompt), 1
        return ids.to(dev), mask.to(dev)

    def seconds(prompts: list[list[int]], new: int, repeats: int) -> float:
        ids, mask = batch(prompts)

        def gen():
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                     do_sample=False, pad_token_id=0)  # fmt: skip
            if out.shape[1] - ids.shape[1] != new:
                raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} tokens, asked for {new}")

        return _timed(gen, sync, repeats)

    first, full = seconds(p["decode"], 1, 2), seconds(p["decode"], a.decode_tokens + 1, 2)
    elapsed = seconds(p["batch"], a.gen_len, 1)
    return {"decode_tok_s": a.decode_tokens / (full - first), "output_tok_s": a.num_seqs * a.gen_len / elapsed,
            "prefill_tok_s": a.num_seqs * a.prompt_len / seconds(p["prefill"], 1, 3), "batched_elapsed_s": elapsed}  # fmt: skip


def part_parity(a: argparse.Namespace) -> dict:
    """The engine's greedy tokens on the default model's and Qwen2-0.5B's shapes (random weights) against
    transformers on the same device, teacher-forced: per generated token, whether it is transformers'
    argmax there and the largest |logprob difference|."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from core import LLM, SamplingParams

    plat = _platform(a.device)
    dev, result = plat.torch_device(), {}
    shapes = {"default model shape (SmolLM2-135M)": (LlamaConfig, LlamaForCausalLM, SMOLLM2_135M),
              "Qwen2-0.5B shape": (Qwen2Config, Qwen2ForCausalLM, QWEN2_05B)}  # fmt: skip
    for label, (config_cls, model_cls, config) in shapes.items():
        torch.manual_seed(a.seed)
        folder = Path(a.model_dir) / label.split()[0]
        with torch.device(dev):
            model_cls(config_cls(**{"initializer_range": 0.1, **(TINY if a.tiny else config)})).save_pretrained(folder)
        prompts = [[1, 5, 9, 33, 2], list(range(3, 40)), [7], [(i * 37) % 500 for i in range(100)]]
        params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=0)
        for dtype in ("float32", "bfloat16"):
            llm = LLM(model=str(folder), device=a.device, dtype=dtype, skip_tokenizer_init=True, seed=0,
                      max_num_seqs=8, max_model_len=256)  # fmt: skip
            outs = [
                o.outputs[0] for o in llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
            ]
            llm.shutdown()
            del llm
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(dev).eval()
            argmax_same, total, worst = 0, 0, 0.0
            for prompt, out in zip(prompts, outs, strict=True):
                ids = torch.tensor([prompt + list(out.token_ids)], device=dev)
                with torch.inference_mode():
                    logp = torch.log_softmax(hf(ids).logits[0].float(), -1)[len(prompt) - 1 : -1]
                for pos, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
                    argmax_same += int(logp[pos].argmax()) == tok
                    worst = max(worst, abs(float(logp[pos, tok]) - lp[tok].logprob))
                    total += 1
            del hf
            torch.cuda.empty_cache() if dev.type == "cuda" else None
            result[f"{label} {dtype}"] = {"argmax_same": argmax_same, "tokens": total, "max_logprob_diff": worst}
    return result


#: profiler event names (CUDA runtime / driver API) counted per engine step
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
COPIES = ("cudaMemcpyAsync",)


def _calls(events, names: tuple[str, ...]) -> int:
    """How many times the profiler saw the events ``names``."""
    return sum(e.count for e in events if e.key in names)


def part_profile(a: argparse.Namespace) -> dict:
    """torch.profiler over a prefill (N x prompt, one token each), 32 batch-1 decode steps and 32 steps
    of N sequences decoding (8-token prompts), graphs on:
    launches, copies and synchronisations per engine step, host vs device time, the top kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from core import LLM, SamplingParams

    llm = LLM(model=a.model_dir, device=a.device, dtype=a.dtype, skip_tokenizer_init=True, enable_prefix_caching=False,
              max_num_seqs=a.num_seqs, seed=a.seed, max_model_len=a.prompt_len + 64)  # fmt: skip
    p = _prompts(a, llm.engine.loaded.hf_config.vocab_size)
    steps = [0]
    step = llm.engine.step

    def counted_step():
        steps[0] += 1
        return step()

    llm.engine.step = counted_step
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    decode = SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True)
    work = {"prefill": lambda: llm.generate(prompt_token_ids=p["prefill"], sampling_params=one, use_tqdm=False),
            "decode": lambda: llm.generate(prompt_token_ids=p["decode"], sampling_params=decode, use_tqdm=False),
            f"decode x{a.num_seqs}": lambda: llm.generate(prompt_token_ids=[q[:8] for q in p["batch"]],
                                                          sampling_params=decode, use_tqdm=False)}  # fmt: skip
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    result = {}
    for name, fn in work.items():
        fn()  # warm-up (graphs, Triton compiles)
        llm.engine.platform.synchronize()
        steps[0] = 0
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            fn()
        wall = time.perf_counter() - start
        events = prof.key_averages()
        kernels = sorted((e for e in events if e.device_type.name == "CUDA"), key=lambda e: -e.self_device_time_total)
        n = max(steps[0], 1)
        result[name] = {"steps": steps[0], "wall_ms": wall * 1e3,
                        "device_ms": sum(e.self_device_time_total for e in kernels) / 1e3,
                        "launches_per_step": _calls(events, LAUNCHES) / n, "syncs_per_step": _calls(events, SYNCS) / n,
                        "copies_per_step": _calls(events, COPIES) / n,
                        "top_kernels": [(e.key[:80], e.count, round(e.self_device_time_total / 1e3, 3)) for e in kernels[:15]],
                        "top_host": events.table(sort_by="self_cpu_time_total", row_limit=25)}  # fmt: skip
    return result


PARTS = {"prepare": part_prepare, "engine": part_engine, "hf": part_hf, "profile": part_profile, "parity": part_parity}


def run_part(a: argparse.Namespace, name: str, *extra: str) -> dict:
    """One part in a fresh interpreter; its result, or ``{"error": ...}`` (also on timeout)."""
    cmd = [sys.executable, __file__, "--part", name, "--model-dir", a.model_dir]
    cmd += ["--device", a.device, "--dtype", a.dtype]
    sizes = ("seed", "decode_tokens", "num_seqs", "prompt_len", "gen_len")
    cmd += [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in sizes]
    cmd += [*extra, *(["--tiny"] if a.tiny else [])]
    print(f"== {name} {' '.join(extra)} ...", file=sys.stderr, flush=True)
    limit = min(a.part_timeout, a.deadline - time.monotonic())  # leave the table time to print before --budget-s
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=max(limit, 1))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {limit:.0f}s (--part-timeout {a.part_timeout}, --budget-s {a.budget_s})"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": f"exit code {proc.returncode}: {proc.stdout[-500:]}"}


def summarize(d: dict) -> tuple[list[str], list[list[str]]]:
    """The comparison table (header, rows); the floors and the two targets' ratios go to ``d["summary"]``."""
    from floors import ModelShape, workload_flops

    prep, hf, s = d["prepare"], d.get("hf", {}), d["setup"]
    shape, bw, rate = ModelShape(**prep["shape"]), prep["bandwidth_gb_s"] * 1e9, prep["matmul_tflop_s"] * 1e12
    n, pl, gl = s["num_seqs"], s["prompt_len"], s["gen_len"]
    weights = [r["weights_bytes"] for k, r in d.items() if k.startswith("engine") and "weights_bytes" in r]
    floor_dec = bw / (weights or [shape.file_bytes])[0]  # the engine's weights in memory; one read per decode step
    floor_pre = n * pl / (workload_flops(shape, n, pl, 0) / rate)
    ceiling = n * gl / (workload_flops(shape, n, pl, gl) / rate)
    f, r = (lambda v: "n/a" if not v else f"{v:.1f}"), (lambda x, y: None if not x or not y else x / y)
    rows = [["physical floor", f(floor_dec), f"{1e3 / floor_dec:.3f}", "1.00", "-", f(floor_pre), "1.00", "-",
             f(ceiling), "-"]]  # fmt: skip
    for key in ("engine:graphs", "engine:cublas", "engine:eager", "hf"):
        res = d.get(key, {})
        dec, pre, tp = res.get("decode_tok_s"), res.get("prefill_tok_s"), res.get("output_tok_s")
        cells = [r(floor_dec, dec), r(dec, hf.get("decode_tok_s")), r(floor_pre, pre), r(pre, hf.get("prefill_tok_s")),
                 r(tp, hf.get("output_tok_s"))]  # fmt: skip
        x_floor, x_hf, x_pre, x_pre_hf, x_tp = ("n/a" if c is None else f"{c:.2f}" for c in cells)
        label = {"hf": "transformers generate", "engine:cublas": "core graphs, cuBLAS only"}.get(
            key, f"core {key[7:]}"
        ) + (" FAILED" if "error" in res else "" if key in d else " (skipped)")
        rows.append([label, f(dec), f"{1e3 / dec:.3f}" if dec else "n/a", x_floor, x_hf, f(pre), x_pre, x_pre_hf, f(tp),
                     x_tp])  # fmt: skip
        if key == "engine:graphs":
            decode_x_floor, prefill_x_hf, concurrency_x_hf = cells[0], cells[3], cells[4]
    d["summary"] = {"decode_floor_tok_s": floor_dec, "prefill_floor_tok_s": floor_pre, "compute_ceiling_tok_s": ceiling,
                    "decode_x_floor": decode_x_floor, "prefill_x_hf": prefill_x_hf, "concurrency_x_hf": concurrency_x_hf}  # fmt: skip
    return ["system", "b1 decode tok/s", "ms/token", "x floor (<=2.5)", "vs HF", f"prefill {n}x{pl} tok/s",
            "x TC floor", "vs HF (>=1.5)", f"{n}x({pl}+{gl}) gen tok/s", f"vs HF (>=8 at {n})"], rows  # fmt: skip


def run_check(a: argparse.Namespace) -> int:
    """plugin_cuda's pytest suite (conformance kit included), then greedy parity vs the reference platform."""
    import torch
    from core.bench.report import format_table
    from plugins.reference import ReferencePlatform
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from core import LLM, SamplingParams

    tests = subprocess.run([sys.executable, "-m", "pytest", *shlex.split(a.pytest_args)], cwd=HERE.parent).returncode
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**TINY)).save_pretrained(a.model_dir)
    prompts = [[1, 5, 9, 33, 2], list(range(3, 40)), [7], [(i * 37) % 500 for i in range(100)]]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def tokens(device, dtype: str, eager: bool) -> list[list[int]]:
        llm = LLM(model=a.model_dir, device=device, dtype=dtype, skip_tokenizer_init=True, seed=0, enforce_eager=eager,
                  max_num_seqs=8)  # fmt: skip
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        llm.shutdown()
        return [list(o.outputs[0].token_ids) for o in outs]

    rows, failed = [], tests != 0
    for dtype in ("float32", "bfloat16"):
        ref = tokens(ReferencePlatform(), dtype, True)
        for eager in (False, True):
            got = tokens(a.device, dtype, eager)
            same = sum(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x)) for x, y in zip(got, ref))  # noqa: B905
            required = dtype == "float32"  # bf16 rounding differs between backends: reported, not required
            failed |= required and got != ref
            rows.append([f"{a.device} {dtype} {'eager' if eager else 'graphs'} vs reference", f"{same}/{sum(map(len, ref))}",
                         ("PASS" if got == ref else "FAIL") if required else "info"])  # fmt: skip
    print(format_table(["greedy parity (tiny Qwen2, 4 prompts x 16 tokens)", "same tokens", "verdict"], rows))
    a.deadline, a.part_timeout = time.monotonic() + 240, 240
    parity = run_part(a, "parity")
    if "error" in parity:
        print(f"parity vs transformers FAILED: {parity['error'].strip()[-300:]}")
    rows = []
    for label, r in parity.items() if "error" not in parity else ():
        ok = r["argmax_same"] == r["tokens"] and r["max_logprob_diff"] < (1e-3 if "float32" in label else 0.1)
        failed |= "float32" in label and not ok
        rows.append([label, f"{r['argmax_same']}/{r['tokens']}", f"{r['max_logprob_diff']:.2e}", "PASS" if ok else
                     ("FAIL" if "float32" in label else "info")])  # fmt: skip
    print(format_table(["vs transformers, teacher-forced (4 prompts x 32 tokens)", "engine token = HF argmax",
                        "max |logprob diff|", "verdict"], rows))  # fmt: skip
    print(f"pytest {a.pytest_args}: {'passed' if tests == 0 else f'FAILED (exit code {tests})'}")
    return 1 if failed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="platform name (cpu_x86 etc. to try the code path off-GPU)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--tiny", action="store_true", help="tiny random model and small sizes (a CPU smoke run)")
    p.add_argument("--decode-tokens", type=int, help="tokens timed in batch-1 decode (256; --tiny 16)")
    p.add_argument("--num-seqs", type=int, help="concurrent requests / HF batch (64; --tiny 4)")
    p.add_argument("--prompt-len", type=int, help="prompt tokens of each batched request (128; --tiny 16)")
    p.add_argument("--gen-len", type=int, help="generated tokens of each batched request (256; --tiny 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="", help="comma list of parts to skip: graphs, cublas, eager, hf, profile")
    p.add_argument("--part-timeout", type=int, default=240, help="seconds one part may take")
    p.add_argument("--budget-s", type=int, default=540, help="seconds all parts may take together")
    p.add_argument("--model-dir", default=None, help="where the random model is written (default: a temp dir)")
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--check", action="store_true", help="run the GPU checks instead of the benchmark")
    p.add_argument("--pytest-args", default="plugin_cuda/tests -q -rs", help="what --check passes to pytest")
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cublas", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    decode, seqs, prompt, gen, a.copy_mib, a.matmul_sizes = SIZES["tiny" if a.tiny else "full"]
    for name, default in (("decode_tokens", decode), ("num_seqs", seqs), ("prompt_len", prompt), ("gen_len", gen)):
        setattr(a, name, getattr(a, name) or default)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.part:
        print("RESULT " + json.dumps(PARTS[a.part](a), default=str), flush=True)
        return 0
    require_device(a.device)
    a.deadline = time.monotonic() + a.budget_s
    own_dir = a.model_dir is None
    a.model_dir = a.model_dir or tempfile.mkdtemp(prefix="cuda_vs_transformers-")
    try:
        return run_check(a) if a.check else benchmark(a, argv)
    finally:
        if own_dir:
            shutil.rmtree(a.model_dir, ignore_errors=True)


def benchmark(a: argparse.Namespace, argv: list[str] | None) -> int:
    from core.bench.report import format_table

    skip = set(filter(None, a.skip.split(",")))
    d: dict = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "command": shlex.join(["python", "bench/cuda_vs_transformers.py", *(sys.argv[1:] if argv is None else argv)]),
               "setup": {k: getattr(a, k) for k in ("device", "dtype", "decode_tokens", "num_seqs", "prompt_len", "gen_len")},
               "model": "tiny Qwen2" if a.tiny else "Qwen2-0.5B config, random weights"}  # fmt: skip
    d["prepare"] = run_part(a, "prepare")
    if "error" not in d["prepare"]:
        for mode, flags in (("graphs", []), ("cublas", ["--cublas"]), ("eager", ["--eager"])):
            if mode not in skip:
                d[f"engine:{mode}"] = run_part(a, "engine", *flags)
        if "hf" not in skip:
            d["hf"] = run_part(a, "hf")
        if "profile" not in skip:
            d["profile"] = run_part(a, "profile")
    prep = d["prepare"]
    if "error" not in prep:
        print(f"{prep['device_info'].get('name', a.device)}: copy {prep['bandwidth_gb_s']:.0f} GB/s (read+write), "
              f"{a.dtype} matmul {prep['matmul_tflop_s']:.3g} TFLOP/s (best of {prep['matmul_sizes']}^3); "
              f"model {d['model']}, {prep['shape']['file_bytes'] / 1e6:.3g} MB of matmul weights")  # fmt: skip
        print(format_table(*summarize(d)))
        for text, key, met in (("batch-1 decode time / bandwidth floor, target <= 2.5", "decode_x_floor", lambda x: x <= 2.5),
                               (f"prefill {a.num_seqs}x{a.prompt_len} / transformers, target >= 1.5", "prefill_x_hf", lambda x: x >= 1.5),
                               (f"{a.num_seqs}-concurrency / transformers, target >= 8", "concurrency_x_hf", lambda x: x >= 8)):  # fmt: skip
            x = d["summary"][key]
            print(f"{text}: " + ("n/a" if x is None else f"{x:.2f}, {'met' if met(x) else 'NOT MET'}"))
    for choice in d.get("engine:graphs", {}).get("skinny_gemm", []):
        print("skinny GEMM " + ", ".join(f"{k} {v}" for k, v in choice.items()))
    prof = d.get("profile", {})
    for name, r in prof.items() if "error" not in prof else ():
        print(f"profile {name}: {r['steps']} steps, {r['wall_ms']:.1f} ms wall, {r['device_ms']:.1f} ms of kernels; "
              f"per step {r['launches_per_step']:.1f} launches, {r['copies_per_step']:.1f} copies, "
              f"{r['syncs_per_step']:.1f} synchronisations")  # fmt: skip
        for kernel, calls, ms in r["top_kernels"]:
            print(f"    {ms:9.3f} ms  {calls:6d}x  {kernel}")
    for key, res in d.items():
        if isinstance(res, dict) and "error" in res:
            print(f"{key} FAILED: {res['error'].strip()[-300:]}")
    if a.json:
        Path(a.json).write_text(json.dumps(d, indent=2, default=str) + "\n")
    return 1 if any("error" in v for v in d.values() if isinstance(v, dict)) else 0


if __name__ == "__main__":
    sys.exit(main())
