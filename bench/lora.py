"""LoRA serving on the default model: base vs one adapter vs a 4-adapter mix, ours beside
transformers + peft (and llama.cpp's ``--lora``) in the same run.

    python bench/lora.py [--streams 32] [--adapters 4] [--prompt 128] [--tokens 64] [--rounds 3]
                         [--targets q_proj,k_proj,...] [--rank 8] [--eager-lora] [--no-hf] [--no-llamacpp]

Adapters: ``--adapters`` peft LoRAs of rank ``--rank`` on ``--targets`` with random A and B
(``init_lora_weights=False``: every adapted module changes the answer), made once on the
GGUF's float32 weights under ``~/.cache/core-bench``. Checked (``greedy equal to peft``): each
adapter's 16 greedy tokens on two prompts equal peft's. Workloads, each side's configurations
timed in alternating rounds (medians; our engines without the prefix cache, so every round
computes its prompts), output tokens per second:

* batched: ``--streams`` prompts of ``--prompt`` tokens, ``--tokens`` generated each: the base
  model (an engine without LoRA), every stream on one adapter, streams spread over all adapters;
* batch 1: one prompt, ``--tokens`` generated: base vs one adapter.

``--eager-lora`` adds the adapter configurations on an engine whose native runner (the CPU
plugins' one call a step) declines steps with adapter rows, so the eager forward runs them.

transformers + peft runs the same workloads (mixed batches with ``adapter_names``); llama.cpp
(llama-batched-bench) the same shapes on the GGUF with one adapter converted by its
``convert_lora_to_gguf.py``, and without. Prints one JSON report. Not for CI.
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

import torch
from core.loader.source import default_model_path

from core import LLM, LoRARequest, SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from hf_baseline import float32_checkpoint  # noqa: E402
from llamacpp import batched_bench, cache_dir, ensure_llamacpp  # noqa: E402

ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
TEXT = (
    "The history of the city begins with a small settlement on the river, where traders met to exchange "
    "salt, grain and cloth. Over the centuries it grew into a market town, then a regional capital with "
    "walls, bridges, a cathedral and a university that drew students from far away. "
)


def make_adapters(base_dir: Path, count: int, rank: int, targets: list[str]) -> list[Path]:
    """``count`` peft adapters on the float32 checkpoint, made once (seed i + 1 for adapter i)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = cache_dir() / f"lora-{base_dir.name}-r{rank}-{'-'.join(t.split('_')[0] for t in targets)}"
    paths = [root / f"adapter{i}" for i in range(count)]
    for i, path in enumerate(paths):
        if not (path / "adapter_config.json").exists():
            torch.manual_seed(i + 1)
            model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
            config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False)
            get_peft_model(model, config).save_pretrained(path)
    return paths


def prompts(tokenizer, num: int, length: int) -> list[list[int]]:
    """``num`` distinct prompts of exactly ``length`` token ids (windows of a long text)."""
    ids = tokenizer.encode(TEXT * (2 + (num + length) // 40))
    assert len(ids) >= num + length, "the text is too short for the prompts"
    return [ids[i : i + length] for i in range(num)]


def timed(runs: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each zero-argument run in ``runs``, ``rounds`` alternating rounds after a warm-up."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def ours(args, paths: list[Path], batch: list[list[int]]) -> dict:
    requests = [LoRARequest(f"a{i}", i + 1, str(p)) for i, p in enumerate(paths)]
    # no prefix cache: every round reruns the same prompts, and the base engine (one workload) would
    # find them cached while the adapter engine's two workloads (prompts under other adapters) evict
    # each other's blocks: prefill would be timed against cache hits
    options = {"max_num_seqs": len(batch), "max_model_len": 1024, "kv_cache_bytes": 256 << 20,
               "enable_prefix_caching": False}  # fmt: skip
    base = LLM(**options)
    lora = LLM(**options, enable_lora=True, max_loras=len(paths), max_lora_rank=args.rank)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)

    def gen(llm, ids, loras):
        return lambda: llm.generate(prompt_token_ids=ids, sampling_params=params, lora_request=loras, use_tqdm=False)

    mixed = [requests[i % len(requests)] for i in range(len(batch))]
    batched = {"base": gen(base, batch, None), "one adapter": gen(lora, batch, requests[0]),
               "mixed": gen(lora, batch, mixed)}  # fmt: skip
    batch1 = {"base": gen(base, batch[:1], None), "one adapter": gen(lora, batch[:1], requests[0])}
    if args.eager_lora:  # a third engine whose native runner declines adapter steps: the eager forward runs them
        eager = LLM(**options, enable_lora=True, max_loras=len(paths), max_lora_rank=args.rank)
        fused = eager.engine.executor.runner.runner.fused
        fused.can_run = lambda inputs, can_run=fused.can_run: inputs.lora is None and can_run(inputs)
        batched |= {"one adapter, eager": gen(eager, batch, requests[0]), "mixed, eager": gen(eager, batch, mixed)}
        batch1["one adapter, eager"] = gen(eager, batch[:1], requests[0])
    return {
        "batched": timed(batched, args.rounds),
        "batch 1": timed(batch1, args.rounds),
        "greedy": {
            str(p): lora.generate(
                prompt_token_ids=batch[:2],
                sampling_params=SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                lora_request=r,
                use_tqdm=False,
            )  # fmt: skip
            for p, r in zip(paths, requests, strict=True)
        },
    }


def hf(args, base_dir: Path, paths: list[Path], batch: list[list[int]]) -> tuple[dict, dict]:
    """transformers + peft: the timings and each adapter's greedy tokens (16) of the first two prompts."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(model, str(paths[0]), adapter_name="a0")
    for i, path in enumerate(paths[1:], 1):
        model.load_adapter(str(path), adapter_name=f"a{i}")
    names = [f"a{i}" for i in range(len(paths))]

    def gen(ids, adapters, new_tokens=args.tokens):
        x = torch.tensor(ids)
        kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
        with torch.no_grad():
            if adapters is None:
                with model.disable_adapter():
                    return model.generate(input_ids=x, **kwargs)
            return model.generate(input_ids=x, adapter_names=adapters, **kwargs)

    greedy = {str(p): gen(batch[:2], [n] * 2, 16)[:, len(batch[0]) :].tolist() for p, n in zip(paths, names,
                                                                                                 strict=True)}  # fmt: skip
    mixed = [names[i % len(names)] for i in range(len(batch))]
    one = len(batch) * [names[0]]
    timings = {
        "batched": timed(
            {
                "base": lambda: gen(batch, None),
                "one adapter": lambda: gen(batch, one),
                "mixed": lambda: gen(batch, mixed),
            },
            args.rounds,
        ),  # fmt: skip
        "batch 1": timed(
            {"base": lambda: gen(batch[:1], None), "one adapter": lambda: gen(batch[:1], names[:1])}, args.rounds
        ),  # fmt: skip
    }
    return timings, greedy


def llamacpp(args, gguf: Path, base_dir: Path, adapter: Path, streams: int) -> dict:
    """llama-batched-bench's generated tok/s (its S_TG) at batch 1 and ``streams``, without and with ``--lora``."""
    tools = ensure_llamacpp()
    src = tools["lib"].parent.parent / "src" / f"llama_cpp_python-{tools['version']}" / "vendor" / "llama.cpp"
    lora_gguf = adapter / "adapter.gguf"
    if not lora_gguf.exists():
        env = os.environ | {"PYTHONPATH": str(src / "gguf-py")}
        cmd = [sys.executable, str(src / "convert_lora_to_gguf.py"), str(adapter), "--base", str(base_dir),
               "--outtype", "f32", "--outfile", str(lora_gguf)]  # fmt: skip
        subprocess.run(cmd, check=True, env=env, capture_output=True)
    threads = len(os.sched_getaffinity(0))
    out: dict[str, dict] = {}
    for side, extra in (("base", ()), ("one adapter", ("--lora", str(lora_gguf)))):
        rows = batched_bench(Path(tools["bench"]), str(gguf), threads, args.prompt, args.tokens, [1, streams], extra)
        out[side] = {str(r["pl"]): r["speed_tg"] for r in rows}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default=ALL, help="comma-separated peft target modules")
    parser.add_argument("--eager-lora", action="store_true", help="also time adapter steps on the eager forward")
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument("--no-llamacpp", action="store_true")
    args = parser.parse_args()
    gguf = default_model_path()
    base_dir = float32_checkpoint(str(gguf), cache_dir())
    paths = make_adapters(base_dir, args.adapters, args.rank, args.targets.split(","))
    from transformers import AutoTokenizer

    batch = prompts(AutoTokenizer.from_pretrained(base_dir), args.streams, args.prompt)
    mine = ours(args, paths, batch)
    greedy = {p: [o.outputs[0].token_ids for o in outs] for p, outs in mine.pop("greedy").items()}
    report: dict = {"workload": {"streams": args.streams, "prompt": args.prompt, "tokens": args.tokens,
                                 "adapters": args.adapters, "rank": args.rank, "targets": args.targets},
                    "load": os.getloadavg(), "ours": mine}  # fmt: skip
    if not args.no_hf:
        report["transformers+peft"], want = hf(args, base_dir, paths, batch)
        report["greedy equal to peft"] = greedy == want
    if not args.no_llamacpp:
        report["llama.cpp"] = llamacpp(args, gguf, base_dir, paths[0], args.streams)
    for side in ("ours", "transformers+peft"):
        for shape, times in report.get(side, {}).items():
            n = (args.streams if shape == "batched" else 1) * args.tokens
            report[side][shape] = {name: round(n / s, 1) for name, s in times.items()}
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
