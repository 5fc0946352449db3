"""Decode and prefill rates per core, by CPU time: figures a loaded machine does not skew much.

    python bench/per_core.py MODEL.gguf          # CORE_CPU_QUANT_ACTIVATIONS / CORE_CPU_KERNEL_ISA as usual

The kernels run on the calling thread alone (``kernels.num_threads = 1``) and every step is
timed by that thread's CPU time, so other jobs' time slices do not count (shared caches and
memory bandwidth still do). Prints batch-1 decode tok/s per core (64 steps after a 16-token
prompt) and prefill tok/s per core of 4x128 and 1x512 prompts (one step each), best of two.
Not for CI.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _cpu_seconds(engine, prompts: list[list[int]], max_tokens: int, skip_first_step: bool) -> float:
    from core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"per-core-{time.monotonic_ns()}-{i}", params=params, prompt_token_ids=prompt)
    if skip_first_step:
        engine.step()
    start = time.thread_time()
    while engine.has_unfinished_requests():
        engine.step()
    return time.thread_time() - start


def main() -> int:
    import engine_part

    llm = engine_part.make_llm(sys.argv[1] if len(sys.argv) > 1 else None, "gguf", prefix_caching=False)
    engine = llm.engine
    engine.platform.kernels.num_threads = 1
    mode = "int8 activations" if os.environ.get("CORE_CPU_QUANT_ACTIVATIONS") == "1" else "default"
    isa = engine.platform.get_extension("kernel_isa")
    print(f"{Path(sys.argv[1]).name if len(sys.argv) > 1 else 'default model'}, {mode}, {isa}")
    decode = min(_cpu_seconds(engine, [list(range(100, 116))], 65, True) for _ in range(2))
    print(f"  decode: {64 / decode:.1f} tok/s per core")
    rnd = random.Random(0)
    for seqs, length in ((4, 128), (1, 512)):
        prompts = [[rnd.randrange(100, 40000) for _ in range(length)] for _ in range(seqs)]
        seconds = min(_cpu_seconds(engine, prompts, 1, False) for _ in range(2))
        print(f"  prefill {seqs}x{length}: {seconds:.3f} s CPU, {seqs * length / seconds:.0f} tok/s per core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
