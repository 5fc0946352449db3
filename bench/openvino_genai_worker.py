"""openvino-genai's own pipeline on the default GGUF: run by ``bench/openvino_vs_genai.py`` in its venv.

``python openvino_genai_worker.py SPEC.json MODEL.gguf [PRECISION]``: ``LLMPipeline`` reads the GGUF
itself (its GGUF reader: Q4_1 blocks included) with its own defaults for the CPU (scheduler, block
manager, precisions) on ``threads`` threads, prefix caching off; ``PRECISION`` (``f32``, ``bf16``)
sets its ``INFERENCE_PRECISION_HINT`` instead of the CPU's default (bf16 where the CPU has
AVX512_BF16). The result names the precision it ran at, and the KV cache precision and the
int8-activation group size it keeps at any precision (the CPU's defaults: u8, 32). Prints ``RESULT {json}``: batch-1 decode, num_seqs x (prompt_len +
n_gen) throughput and one prompt's prefill, on the token ids it is given (no tokenizer in the loop).
Imports nothing of the project: its venv has openvino-genai, not core.
"""

import json
import sys
import time

import numpy as np
import openvino as ov
import openvino_genai as ov_genai


def generate(pipe, prompts, n_new):
    """Seconds to generate ``n_new`` tokens (greedy, EOS ignored) for each of ``prompts``; the results."""
    ids = np.asarray(prompts, dtype=np.int64)
    inputs = ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    config = ov_genai.GenerationConfig(max_new_tokens=n_new, min_new_tokens=n_new, ignore_eos=True, do_sample=False)
    start = time.perf_counter()
    result = pipe.generate(inputs, config)
    return time.perf_counter() - start, result


def main(spec, model, precision=None):
    scheduler = ov_genai.SchedulerConfig()
    scheduler.cache_size = spec["kv_cache_gib"]
    scheduler.enable_prefix_caching = False
    scheduler.max_num_batched_tokens = 2048
    props = {"INFERENCE_NUM_THREADS": spec["threads"], "NUM_STREAMS": 1}
    if precision is not None:
        props["INFERENCE_PRECISION_HINT"] = precision
    cpu = ov.Core()
    default = cpu.get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    start = time.perf_counter()
    pipe = ov_genai.LLMPipeline(model, "CPU", scheduler_config=scheduler, **props)
    out = {
        "load_s": time.perf_counter() - start,
        "version": ov_genai.__version__,
        "precision": precision or default,
        # the CPU defaults it compiles with at any precision: a u8 KV cache, int8 activations in groups
        "kv_cache": cpu.get_property("CPU", "KV_CACHE_PRECISION").get_type_name(),
        "dynamic_quantization_group": cpu.get_property("CPU", "DYNAMIC_QUANTIZATION_GROUP_SIZE"),
    }
    generate(pipe, [spec["prompt"]], 2)  # warm-up
    decode = []
    for _ in range(2):
        _, result = generate(pipe, [spec["prompt"]], spec["n_gen"] + 1)
        decode.append(1000.0 / result.perf_metrics.get_tpot().mean)
    out["decode_tok_s"] = max(decode)
    elapsed, _ = generate(pipe, spec["prompts"], spec["n_gen"])
    out["output_tok_s"] = len(spec["prompts"]) * spec["n_gen"] / elapsed
    prefill = []
    for _ in range(2):
        _, result = generate(pipe, [spec["prefill_prompt"]], 1)
        prefill.append(len(spec["prefill_prompt"]) * 1000.0 / result.perf_metrics.get_ttft().mean)
    out["prefill_tok_s"] = max(prefill)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f), *sys.argv[2:4])
