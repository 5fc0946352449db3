"""llm-compressor checkpoints of the default model: parity with transformers and decode speed.

    python bench/quantized_checkpoints.py        # quantize once (cached), check, time, update bench/RESULTS.md

Makes the float32 Hugging Face folder of SmolLM2-135M from the packaged GGUF
(``hf_baseline.float32_checkpoint``, without the ``quantization_config`` transformers copies
from the GGUF), quantizes it with llm-compressor (round to nearest: W8A8 with dynamic
per-token int8 activations, W4A16 in groups of 64 symmetric and with zero points; 128 does
not divide the hidden size 576; FP8 W8A8 as its FP8_DYNAMIC and FP8 schemes, FP8's static
input scales calibrated on :data:`CALIBRATION_TEXTS`) in a venv cached under
``~/.cache/core-bench/llmc-venv``,
then for each checkpoint checks greedy parity with transformers
(``plugins.quant_testing.load_decompressed``: decompressed weights, W8A8's activations
fake-quantized per token by compressed-tensors) on this engine's native CPU kernels and
times batch-1 decode next to the engine on the GGUF file. Not for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from results import put_section  # noqa: E402

SECTION = "quantized-checkpoints"
#: name -> compressed-tensors weight arguments (every Linear but lm_head); the W8A8 ones add ACTIVATIONS
SCHEMES = {
    "w8a8": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
    "w4a16-g64": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64},
    "w4a16-asym-g64": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64},
    "fp8-dynamic": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
    "fp8-static": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"},
}
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
QUANTIZE = """
import json, sys
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
source, out, groups, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
calibration = {}
if texts:
    from datasets import Dataset
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(source)
    rows = {k: [tok(t)[k] for t in texts] for k in ("input_ids", "attention_mask")}
    calibration = {"dataset": Dataset.from_dict(rows), "num_calibration_samples": len(texts)}
recipe = QuantizationModifier(config_groups=groups, ignore=["lm_head"])
oneshot(model=source, recipe=recipe, output_dir=out, **calibration)
"""


def llmc_python(cache: Path) -> Path:
    """The cached venv's python with llm-compressor (created on first use: a few minutes)."""
    venv = cache / "llmc-venv"
    python = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0", "llmcompressor"], check=True)
        (venv / ".ready").touch()
    return python


def quantized_checkpoint(name: str, source: Path, cache: Path) -> tuple[Path, float]:
    """``(directory, seconds it took to make, 0 if cached)`` of the ``name`` checkpoint of ``source``."""
    out = cache / f"{source.name}-{name}"
    if (out / "config.json").exists():
        return out, 0.0
    group = {"targets": ["Linear"], "weights": SCHEMES[name]}
    if name in ACTIVATIONS:
        group["input_activations"] = ACTIVATIONS[name]
    static = name in ACTIVATIONS and not ACTIVATIONS[name]["dynamic"]
    start = time.perf_counter()
    cmd = [str(llmc_python(cache)), "-c", QUANTIZE, str(source), str(out), json.dumps({"group_0": group})]
    cmd.append(json.dumps(CALIBRATION_TEXTS if static else []))
    subprocess.run(cmd, check=True)
    return out, time.perf_counter() - start


def parity(directory: Path, prompts: list[list[int]], num_steps: int) -> str:
    """Greedy parity of the native CPU kernels with transformers on ``directory``."""
    import torch
    from core.bench.parity import greedy_parity, hf_next_logits
    from core.loader import load_model
    from plugin_cpu_x86.platform import CpuX86Platform
    from plugins.quant_testing import load_decompressed

    hf = load_decompressed(directory)
    loaded = load_model(str(directory), kernels=CpuX86Platform().kernels, dtype=torch.float32, device="cpu")
    try:
        return greedy_parity(loaded.model, hf_next_logits(hf), prompts, num_steps).describe()
    except AssertionError as broken:  # reported, not fatal: the other checkpoints still run
        return f"**broken**: {broken}"


def decode(model: str | None, prompt: list[int], n_gen: int) -> dict:
    """Batch-1 decode tok/s of the engine on ``model`` (None: the default GGUF), and its weight bytes."""
    from engine_part import decode_tok_s, make_llm

    llm = make_llm(model, None, prefix_caching=False)
    return {"decode_tok_s": decode_tok_s(llm, prompt, n_gen), "weights_mb": llm.engine.loaded.weights_bytes / 1e6}


def render(rows: list[dict], command: str, load: tuple[float, float]) -> str:
    lines = [
        f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); float32 compute, native "
        f"cpu_x86 kernels; **machine loaded** (load average {load[0]:.1f} at the start, {load[1]:.1f} at the end "
        "on 2 CPUs shared with other jobs): read the rates as rough, the ratios to one digit.",
        "",
        "| checkpoint | weights MB | decode tok/s (batch 1) | greedy parity vs transformers | quantize s |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        made = f"{r['quantize_s']:.0f}" if r.get("quantize_s") else "cached" if "quantize_s" in r else "-"
        lines.append(
            f"| {r['name']} | {r['weights_mb']:.0f} | {r['decode_tok_s']:.1f} | {r.get('parity', '-')} | {made} |"
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
    from core.loader.source import default_model_path
    from llamacpp import cache_dir

    load_start = os.getloadavg()[0]
    cache = cache_dir()
    source = hf_baseline.float32_checkpoint(str(default_model_path()), cache)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source)
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]
    prompts = [tok(t)["input_ids"] for t in texts]
    rows = [{"name": "GGUF Q4_1 (default file, blocks kept)", **decode(None, prompts[0], a.decode_tokens)}]
    rows.append({"name": "float32 (the GGUF dequantized)", **decode(str(source), prompts[0], a.decode_tokens)})
    for name in a.schemes.split(","):
        directory, seconds = quantized_checkpoint(name, source, cache)
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
        path = Path(a.results)
        path.write_text(put_section(path.read_text() if path.exists() else "", SECTION, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
