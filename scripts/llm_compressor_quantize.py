"""Quantize Hugging Face checkpoints with llm-compressor's ``oneshot`` (run by the python of
scripts/llm_compressor_venv.sh, not the project's venv).

    python scripts/llm_compressor_quantize.py JOBS.json

JOBS.json is a list of jobs, each ``{"source": dir, "out": dir, "groups": config_groups,
"calibration": [[token ids], ...] or null, "modifier": "rtn" | "awq"}``: ``groups`` are
compressed-tensors scheme arguments for every Linear but ``lm_head``; ``rtn`` is
``QuantizationModifier`` (round to nearest; calibration only for static input scales),
``awq`` is ``AWQModifier`` (its scale search runs on the calibration rows). The checkpoint
is saved compressed, as llm-compressor saves it, into ``out``. One process for every job.

llm-compressor 0.14's AWQ pins its cached activations in page-locked memory before every
scale search (faster copies to a GPU), which torch refuses on a machine without an
accelerator; pinning changes no value, so on such a machine it is skipped here.
"""

import json
import sys

import torch
from llmcompressor import oneshot
from llmcompressor.modifiers.awq import AWQModifier
from llmcompressor.modifiers.quantization import QuantizationModifier
from llmcompressor.pipelines.cache import IntermediatesCache

if not torch.accelerator.is_available():
    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None


def main(path: str) -> None:
    for job in json.load(open(path)):
        modifier = AWQModifier if job["modifier"] == "awq" else QuantizationModifier
        recipe = modifier(config_groups=job["groups"], ignore=["lm_head"])
        calibration = {}
        if job.get("calibration"):
            from datasets import Dataset

            rows = job["calibration"]
            data = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})
            calibration = {"dataset": data, "num_calibration_samples": len(rows)}
        oneshot(model=job["source"], recipe=recipe, output_dir=job["out"], **calibration)
        print(f"quantized {job['source']} -> {job['out']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
