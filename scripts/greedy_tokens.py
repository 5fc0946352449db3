"""Greedy tokens of the offline API, for comparing devices across processes (and ISAs:
scripts/test_cross.sh runs `run` natively on cpu_x86 and under qemu-aarch64 on cpu_arm).

    python scripts/greedy_tokens.py build DIR          save the tiny random Llama to DIR
    python scripts/greedy_tokens.py run DIR DEVICE     print its greedy tokens on DEVICE (JSON)
    python scripts/greedy_tokens.py default DEVICE     the default model's, on text prompts

`build` fixes the weights (seed 0) in a safetensors checkpoint, so both sides of a
comparison load the same bytes whatever their torch version or processor.
"""

from __future__ import annotations

import json
import sys
import time

#: token-id prompts of different lengths for the tiny model (vocabulary 256)
TINY_PROMPTS = [[5, 17, 200, 3], list(range(10, 47)), [9], [(7 * i + 3) % 256 for i in range(70)]]
#: text prompts for the default model (its GGUF carries the tokenizer)
TEXT_PROMPTS = ["The capital of France is", "Hello, my name is"]
MAX_TOKENS = 10


def build(directory: str) -> None:
    import torch
    from plugins.reference import tiny_model_config
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(tiny_model_config()).eval().save_pretrained(directory)


def generate(prompts: list, device: str, **engine_kwargs) -> dict:
    """The greedy tokens of ``prompts`` on ``device``, the kernel variant that ran them, the time."""
    from core import LLM, SamplingParams

    start = time.perf_counter()

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm = LLM(device=device, dtype="float32", max_model_len=128, **engine_kwargs)
    key = "prompt_token_ids" if isinstance(prompts[0], list) else "prompts"
    outs = llm.generate(**{key: prompts}, sampling_params=params, use_tqdm=False)
    return {
        "device": device,
        "kernel_isa": llm.engine.platform.get_extension("kernel_isa"),
        "tokens": [list(out.outputs[0].token_ids) for out in outs],
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "build":
        build(argv[1])
    elif len(argv) == 3 and argv[0] == "run":
        print(json.dumps(generate(TINY_PROMPTS, argv[2], model=argv[1], skip_tokenizer_init=True)))
    elif len(argv) == 2 and argv[0] == "default":
        print(json.dumps(generate(TEXT_PROMPTS, argv[1], kv_cache_bytes=64 << 20)))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
