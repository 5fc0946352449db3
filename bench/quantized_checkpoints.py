"""llm-compressor checkpoints of the default model: parity with transformers and decode speed.

    python bench/quantized_checkpoints.py        # quantize once (cached), check, time, update bench/RESULTS.md

Makes the float32 Hugging Face folder of SmolLM2-135M from the packaged GGUF
(``hf_baseline.float32_checkpoint``, without the ``quantization_config`` transformers copies
from the GGUF), quantizes it with llm-compressor (round to nearest: W8A8 with dynamic
per-token int8 activations, W4A16 in groups of 64 symmetric and with zero points; 128 does
not divide the hidden size 576; FP8 W8A8 as its FP8_DYNAMIC and FP8 schemes; AWQ: W4A16
with zero points in groups of 64 after AWQ's activation-aware scale search; FP8's static
input scales and AWQ calibrated on :data:`CALIBRATION_TEXTS`) in the venv of
scripts/llm_compressor_venv.sh (scripts/llm_compressor_quantize.py),
then for each checkpoint checks greedy parity with transformers
(``plugins.testing.quant.load_decompressed``: decompressed weights, W8A8's activations
fake-quantized per token by compressed-tensors) on this engine's native CPU kernels and
times batch-1 decode next to the engine on the GGUF files (the default Q4_1 and a Q8_0 made
by ``gguf_files.py``), llama.cpp (llama-cpp-python) on the same GGUF files, and the engine
with an FP8 KV cache. Not for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from results import write_section  # noqa: E402

SECTION = "quantized-checkpoints"
#: name -> compressed-tensors weight arguments (every Linear but lm_head); the W8A8 ones add ACTIVATIONS
SCHEMES = {
    "w8a8": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
    "w4a16-g64": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64},
    "w4a16-asym-g64": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64},
    "fp8-dynamic": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
    "fp8-static": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"},
    "awq-w4a16-asym-g64": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64},
}
#: schemes made by llm-compressor's AWQModifier (the others: QuantizationModifier, round to nearest)
AWQ = {"awq-w4a16-asym-g64"}
ACTIVATIONS = {
    "w8a8": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
    "fp8-dynamic": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True},
    "fp8-static": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False},
}
#: the static input scales' calibration set (a few sentences: no dataset download)
CALIBRATION_TEXTS = [
    "The capital of France is Paris, a city on the Seine.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Once upon a time, a small robot lived in a quiet village by the sea.",
    "Water boils at one hundred degrees Celsius at sea level.",
]
LLMC = HERE.parent / "scripts"  # the llm-compressor venv and the quantize job runner


def llmc_python() -> Path:
    """The python of the llm-compressor venv (scripts/llm_compressor_venv.sh, made on first use)."""
    out = subprocess.run([str(LLMC / "llm_compressor_venv.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def quantized_checkpoint(name: str, source: Path, cache: Path, calibration: list[list[int]]) -> tuple[Path, float]:
    """``(directory, seconds it took to make, 0 if cached)`` of the ``name`` checkpoint of ``source``."""
    out = cache / f"{source.name}-{name}"
    if (out / "config.json").exists():
        return out, 0.0
    group = {"targets": ["Linear"], "weights": SCHEMES[name]}
    if name in ACTIVATIONS:
        group["input_activations"] = ACTIVATIONS[name]
    calibrated = name in AWQ or (name in ACTIVATIONS and not ACTIVATIONS[name]["dynamic"])
    job = {"source": str(source), "out": str(out), "groups": {"group_0": group}}
    job |= {"calibration": calibration if calibrated else None, "modifier": "awq" if name in AWQ else "rtn"}
    start = time.perf_counter()
    with tempfile.NamedTemporaryFile("w", suffix=".json") as jobs:
        json.dump([job], jobs)
        jobs.flush()
        subprocess.run([str(llmc_python()), str(LLMC / "llm_compressor_quantize.py"), jobs.name], check=True)
    return out, time.perf_counter() - start


def parity(directory: Path, prompts: list[list[int]], num_steps: int) -> str:
    """Greedy parity of the native CPU kernels with transformers on ``directory``."""
    import torch
    from core.bench.parity import greedy_parity, hf_next_logits
    from core.loader import load_model
    from plugin_cpu_x86.platform import CpuX86Platform
    from plugins.testing.quant import load_decompressed

    hf = load_decompressed(directory)
    loaded = load_model(str(directory), kernels=CpuX86Platform().kernels, dtype=torch.float32, device="cpu")
    try:
        return greedy_parity(loaded.model, hf_next_logits(hf), prompts, num_steps).describe()
    except AssertionError as broken:  # reported, not fatal: the other checkpoints still run
        return f"**broken**: {broken}"


def engine_parity(llm, reference_logits, prompts: list[list[int]], num_steps: int) -> str:
    """:func:`core.bench.parity.greedy_parity`'s rule for a whole engine (its KV cache included):
    greedy tokens with top-5 logprobs, checked step by step against ``reference_logits``."""
    from core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=num_steps, ignore_eos=True, logprobs=5)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    differences = []
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        ours = out.outputs[0]
        for step, mine in enumerate(ours.token_ids):
            reference = reference_logits(prompt + ours.token_ids[:step]).float()
            theirs = int(reference.argmax())
            if theirs != mine:
                top_theirs = reference.topk(5).indices.tolist()
                if mine not in top_theirs or theirs not in ours.logprobs[step]:
                    return f"**broken**: prompt {i} step {step}: ours {mine}, reference {theirs}"
                differences.append(f"prompt {i} at step {step}")
                break
    text = f"{len(prompts) - len(differences)}/{len(prompts)} equal"
    return text + (f" (first difference: {', '.join(differences)}, within top 5)" if differences else "")


def decode(model: str | None, prompt: list[int], n_gen: int, kv_cache_dtype: str = "auto", parity=None) -> dict:
    """Batch-1 decode tok/s of the engine on ``model`` (None: the default GGUF), its weight bytes
    and KV capacity; with ``parity = (reference_logits, prompts, steps)`` also :func:`engine_parity`."""
    from engine_part import decode_tok_s, make_llm

    llm = make_llm(model, None, prefix_caching=False, kv_cache_dtype=kv_cache_dtype)
    bm = llm.engine.block_manager
    row = {
        "decode_tok_s": decode_tok_s(llm, prompt, n_gen),
        "weights_mb": llm.engine.loaded.weights_bytes / 1e6,
        "kv_tokens": bm.num_total_blocks * bm.block_size,
    }
    if parity is not None:
        row["parity"] = engine_parity(llm, *parity)
    llm.shutdown()  # its compute threads would share the CPUs with the next row
    return row


def llamacpp_decode(model: Path, n_gen: int) -> dict:
    """Batch-1 decode tok/s of llama.cpp (llama-cpp-python, 2 threads) on a GGUF file, and its size."""
    import llamacpp

    cpp = llamacpp.ensure_llamacpp()
    rate = llamacpp.python_decode(cpp["python"], cpp["lib"], str(model), 2, n_gen)
    return {"decode_tok_s": rate, "weights_mb": model.stat().st_size / 1e6, "kv_tokens": None}


def render(rows: list[dict], command: str, load: tuple[float, float]) -> str:
    busy = " (**other jobs were running**: read the rates as rough)" if max(load) > 1.5 else ""
    lines = [
        f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); float32 compute, native "
        f"cpu_x86 kernels, 2 threads; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end on "
        f"{os.cpu_count()} CPUs{busy}. llama.cpp: llama-cpp-python 0.3.36 on the same GGUF files, before any "
        "engine of ours starts.",
        "",
        "| checkpoint | weights MB | decode tok/s (batch 1) | KV cache tokens | greedy parity vs transformers "
        "| quantize s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        made = f"{r['quantize_s']:.0f}" if r.get("quantize_s") else "cached" if "quantize_s" in r else "-"
        kv = "-" if r.get("kv_tokens") is None else f"{r['kv_tokens']:,}"
        lines.append(
            f"| {r['name']} | {r['weights_mb']:.0f} | {r['decode_tok_s']:.1f} | {kv} | {r.get('parity', '-')} "
            f"| {made} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--parity-tokens", type=int, default=16)
    p.add_argument("--results", default=str(HERE / "RESULTS.md"))
    a = p.parse_args(argv)
    import hf_baseline
    import torch
    from core.bench.parity import hf_next_logits
    from core.loader.source import default_model_path
    from llamacpp import cache_dir

    load_start = os.getloadavg()[0]
    cache = cache_dir()
    source = hf_baseline.float32_checkpoint(str(default_model_path()), cache)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source)
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]
    prompts = [tok(t)["input_ids"] for t in texts]
    from gguf_files import ensure_gguf_files
    from transformers import AutoModelForCausalLM

    ggufs = ensure_gguf_files(("Q8_0",))
    float_logits = hf_next_logits(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval())
    rows = [  # llama.cpp first, in a process of its own, before any engine of ours starts
        {"name": "llama.cpp, GGUF Q4_1", **llamacpp_decode(ggufs["Q4_1"], a.decode_tokens)},
        {"name": "llama.cpp, GGUF Q8_0", **llamacpp_decode(ggufs["Q8_0"], a.decode_tokens)},
        {"name": "GGUF Q4_1 (default file, blocks kept)", **decode(None, prompts[0], a.decode_tokens)},
        {
            "name": "GGUF Q4_1, `--kv-cache-dtype fp8` (E4M3 KV blocks)",
            **decode(None, prompts[0], a.decode_tokens, "fp8", (float_logits, prompts, a.parity_tokens)),
        },
        {"name": "GGUF Q8_0 (made by bench/gguf_files.py)", **decode(str(ggufs["Q8_0"]), prompts[0], a.decode_tokens)},
        {"name": "float32 (the GGUF dequantized)", **decode(str(source), prompts[0], a.decode_tokens)},
    ]
    for row in rows:
        print(row, flush=True)
    for name in a.schemes.split(","):
        directory, seconds = quantized_checkpoint(name, source, cache, [tok(t)["input_ids"] for t in CALIBRATION_TEXTS])
        row = {"name": f"compressed-tensors {name}", "quantize_s": seconds}
        row["parity"] = parity(directory, prompts, a.parity_tokens)
        row.update(decode(str(directory), prompts[0], a.decode_tokens))
        rows.append(row)
        print(row, flush=True)
    text = render(
        rows, shlex.join(["python", "bench/quantized_checkpoints.py", *argv]), (load_start, os.getloadavg()[0])
    )
    print(text)
    if a.results:
        write_section(a.results, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
