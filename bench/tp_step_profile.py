"""Where a batch-1 decode step's time goes, TP=1 vs ``-tp 2`` (mp), timed inside the engine's process.

One prompt (``--input-len`` random tokens) decodes ``--output-len`` tokens greedily through the
offline ``LLM`` on the default model, TP=1 (both CPUs, ``CORE_CPU_OMP_THREADS_BIND=auto``) and
TP=2 (one CPU per rank, ``0|1``) each in a fresh process, alternating, ``--rounds`` times. The
engine's step and the executor's functions are wrapped with timers; each row is the median over
the decode steps of that part's time per step:

- ``engine step``: all of ``LLMEngine.step``; ``engine outside execute``: scheduling, sampling,
  detokenizing (the step less ``executor.execute``);
- ``make_batch``: flattening the scheduled sequences into the step's inputs;
- ``pickle.dumps`` / ``pickle.loads``: the executor's (de)serialisation of calls and answers;
- ``send_bytes`` / ``recv_bytes``: pipe writes of calls, reads of answers (the logits, for rank 0);
- ``wait for ranks``: ``multiprocessing.connection.wait`` on the ranks' pipes (their forward plus
  the wake-ups);
- ``queue put``: the driver's write of the step into the shared-memory queue;
- ``driver forward``: rank 0's forward in the engine's process (driver executor).

Whatever a path does not use reads 0. Usage: ``python bench/tp_step_profile.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

PARTS = (
    "engine step",
    "engine outside execute",
    "executor.execute",
    "make_batch",
    "pickle.dumps",
    "pickle.loads",
    "send_bytes",
    "recv_bytes",
    "wait for ranks",
    "queue put",
    "driver forward",
)


def profile(tp: int, input_len: int, output_len: int) -> dict[str, float]:
    """The median per-step time (ms) of each of :data:`PARTS` over the decode steps, in this process."""
    import pickle
    from multiprocessing.connection import Connection

    import core.distributed.executor as executor_mod
    import core.distributed.mp_executor as mp
    from core.bench.stats import random_prompts
    from core.distributed.shm_queue import ShmQueue
    from core.distributed.worker import Worker
    from core.engine import LLMEngine
    from core.llm import LLM
    from core.sampling_params import SamplingParams

    steps: list[dict[str, float]] = []

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if steps:
                    steps[-1][name] += time.perf_counter() - start

        return wrapper

    def step(self: Any) -> Any:
        steps.append(defaultdict(float))
        start = time.perf_counter()
        out = engine_step(self)
        steps[-1]["engine step"] = time.perf_counter() - start
        return out

    engine_step = LLMEngine.step
    LLMEngine.step = step
    pickle_proxy = argparse.Namespace(
        dumps=timed("pickle.dumps", pickle.dumps), loads=timed("pickle.loads", pickle.loads)
    )
    mp.pickle = pickle_proxy
    mp.wait = timed("wait for ranks", mp.wait)
    for module in (executor_mod, mp):
        if hasattr(module, "make_batch"):
            module.make_batch = timed("make_batch", module.make_batch)
    Connection.send_bytes = timed("send_bytes", Connection.send_bytes)
    Connection.recv_bytes = timed("recv_bytes", Connection.recv_bytes)
    ShmQueue.put = timed("queue put", ShmQueue.put)
    Worker.execute = timed("driver forward", Worker.execute)

    llm = LLM(tensor_parallel_size=tp, max_model_len=1024)
    executor = llm.engine.executor
    executor.execute = timed("executor.execute", executor.execute)
    prompt = random_prompts(1, input_len, 10000, 2)[0]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)  # warm-up
    steps.clear()
    llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    decode = steps[1:]  # the first step is the prompt's
    for s in decode:
        s["engine outside execute"] = s["engine step"] - s["executor.execute"]
    del llm
    return {part: 1e3 * statistics.median(s.get(part, 0.0) for s in decode) for part in PARTS}


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--one", type=int, choices=(1, 2), help=argparse.SUPPRESS)  # a child: profile this TP size
    args = parser.parse_args()
    if args.one:
        print(json.dumps(profile(args.one, args.input_len, args.output_len)))
        return
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for i in range(args.rounds):
        for tp, bind in ((1, "auto"), (2, "0|1")):
            cmd = [sys.executable, __file__, "--one", str(tp), "--input-len", str(args.input_len),
                   "--output-len", str(args.output_len)]  # fmt: skip
            env = {**os.environ, "CORE_CPU_OMP_THREADS_BIND": bind}
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs[tp].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {i + 1} TP={tp}: engine step {runs[tp][-1]['engine step']:.2f} ms ({load()})", flush=True)
    print(f"\nper decode step, ms (median over steps, then over {args.rounds} rounds)")
    print(f"{'part':<24} {'TP=1':>7} {'TP=2':>7}")
    for part in PARTS:
        one, two = (statistics.median(r[part] for r in runs[tp]) for tp in (1, 2))
        print(f"{part:<24} {one:>7.3f} {two:>7.3f}")


if __name__ == "__main__":
    main()
