"""Checkpoints made by llm-compressor itself (vLLM's quantizer), not by our own round-to-nearest
helper: tiny random Llama and Qwen2 models quantized in the test with ``oneshot`` (W8A8 with
dynamic per-token int8 activations, W4A16 in groups of 32 symmetric and with zero points, and
AWQ's W4A16 with zero points after its scale search on a few token rows), then our greedy
decoding on cpu_x86's native kernels against transformers on the same checkpoint
(``plugins.testing.quant.load_decompressed``). llm-compressor pins an older transformers, so it
runs in a venv of its own (scripts/llm_compressor_venv.sh: made once, about a minute, cached
outside the clone), one process for every checkpoint.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from core.bench.parity import greedy_parity, hf_next_logits
from core.loader import load_model
from plugins.reference import tiny_model_config
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

pytest.importorskip("compressed_tensors")
from plugins.testing.quant import load_decompressed, save_word_tokenizer  # noqa: E402

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
ARCHS = {"llama": LlamaConfig, "qwen2": Qwen2Config}
#: name -> (compressed-tensors config group, quantizer)
SCHEMES = {
    "w8a8": (
        {
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
            },
        },
        "rtn",
    ),
    "w4a16": (
        {"weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}},
        "rtn",
    ),
    "w4a16-asym": (
        {"weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 32}},
        "rtn",
    ),
    "awq-w4a16-asym": (
        {"weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 32}},
        "awq",
    ),
}
CALIBRATION = (torch.arange(128).reshape(4, 32) * 37 % 256).tolist()  # token rows for AWQ's scale search
PROMPTS = [[5, 17, 33, 9, 100, 41, 7], [3, 150, 22], [90, 12, 61, 22, 8, 77, 31, 45, 120, 11, 64, 5, 19]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """``(arch, scheme) -> directory``: every checkpoint, made by one llm-compressor process."""
    root = tmp_path_factory.mktemp("llmc")
    jobs, made = [], {}
    for arch, config_cls in ARCHS.items():
        source = root / arch
        torch.manual_seed(0)
        config = tiny_model_config(config_cls, initializer_range=0.1, tie_word_embeddings=arch == "qwen2")
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(source)
        save_word_tokenizer(source, config.vocab_size)  # oneshot wants a processor with a dataset
        for name, (group, modifier) in SCHEMES.items():
            made[(arch, name)] = out = root / f"{arch}-{name}"
            groups = {"group_0": {"targets": ["Linear"], **group}}
            jobs.append({"source": str(source), "out": str(out), "groups": groups, "modifier": modifier})
            jobs[-1]["calibration"] = CALIBRATION if modifier == "awq" else None
    (root / "jobs.json").write_text(json.dumps(jobs))
    venv = subprocess.run([str(SCRIPTS / "llm_compressor_venv.sh")], check=True, capture_output=True, text=True)
    python = venv.stdout.strip().splitlines()[-1]
    run = subprocess.run([python, str(SCRIPTS / "llm_compressor_quantize.py"), str(root / "jobs.json")], text=True,
                         capture_output=True)  # fmt: skip
    assert run.returncode == 0, f"llm-compressor failed:\n{run.stderr[-3000:]}"
    return made


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("name", list(SCHEMES))
def test_llm_compressor_checkpoint_parity(checkpoints, arch, name):
    from plugin_cpu_x86.platform import CpuX86Platform

    directory = checkpoints[(arch, name)]
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors"
    assert config["format"] == ("int-quantized" if name == "w8a8" else "pack-quantized")
    kernels = CpuX86Platform().kernels
    loaded = load_model(str(directory), kernels=kernels, dtype=torch.float32, device="cpu", skip_tokenizer_init=True)
    greedy_parity(loaded.model, hf_next_logits(load_decompressed(directory)), PROMPTS, 6, block_size=4)
