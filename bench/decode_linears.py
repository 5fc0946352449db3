"""Where a batch-1 decode step's linear time goes, per GGUF format and activation path, vs the copy bandwidth.

    python bench/decode_linears.py [--formats Q4_0,Q8_0,Q4_1] [--threads 2] [--steps 20] [--isa auto]

The default model's linears at batch 1 (``qkv`` 576 -> 960, ``o`` 576 -> 576, ``gate_up``
576 -> 3072, ``down`` 1536 -> 576, 30 layers of each, then ``lm_head`` 576 -> 49152 in the
format of the file's token embedding), random weights of each format, called in a step's
order through ``lib.linear`` so every weight comes from memory as in a decode step. Three
activation paths: ``int16`` (the default, ``CK_ACT16`` on the x8 layout), ``int8``
(``CORE_CPU_QUANT_ACTIVATIONS=1``) and ``float`` (float32 activations on the blocks as
stored). Per linear: microseconds a call (the least of ``--steps`` steps: other jobs on a
shared machine only add), GB/s of weight bytes, and that against a float32 copy's bandwidth
(``floors.memory_bandwidth``, read + write counted). A call includes ctypes' ~1 us. Not for CI.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from floors import memory_bandwidth
from linear_kernels import random_weight
from plugin_cpu_x86.platform import ISA_TABLE
from plugins.cpu_native.kernels import NativeCpuKernels
from plugins.cpu_native.library import ACT16, DTYPE_F32

LAYERS = 30
LINEARS = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)
EMBED_FORMAT = {"Q4_0": "Q4_0", "Q8_0": "Q8_0", "Q4_1": "Q8_0"}  # bench/gguf_files.py's files
BYTES_PER_WEIGHT = {"Q4_0": 18 / 32, "Q4_1": 20 / 32, "Q8_0": 34 / 32}


def step_times(kernels: NativeCpuKernels, step: list, threads: int, steps: int) -> dict[str, float]:
    """``{name: least us a call}`` over ``steps`` passes of ``step`` ([(name, weight, code)])."""
    xs = {k: torch.randn(1, k) for k in {w.in_features for _, w, _ in step}}
    outs = {n: torch.empty(1, n) for n in {w.out_features for _, w, _ in step}}
    counts: dict[str, int] = {}
    for name, _, _ in step:
        counts[name] = counts.get(name, 0) + 1
    per_step: dict[str, list[float]] = {name: [] for name in counts}
    for i in range(steps + 1):
        spent = dict.fromkeys(counts, 0)
        for name, w, code in step:
            n, k = w.out_features, w.in_features
            x, out = xs[k], outs[n]
            start = time.perf_counter_ns()
            kernels.lib.linear(code, w.data_ptr, None, n, k, DTYPE_F32, x.data_ptr(), k, 1, out.data_ptr(), None,
                               DTYPE_F32, threads)  # fmt: skip
            spent[name] += time.perf_counter_ns() - start
        if i:  # the first pass warms up
            for name, ns in spent.items():
                per_step[name].append(ns / 1e3 / counts[name])
    return {name: min(v) for name, v in per_step.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", default="Q4_0,Q8_0,Q4_1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--isa", default="auto", help="CPU_KERNEL_ISA")
    args = p.parse_args()
    kernels = NativeCpuKernels(ISA_TABLE, args.isa, num_threads=args.threads)
    copy = memory_bandwidth(args.threads)
    print(f"kernels {kernels.isa}, {args.threads} thread(s), copy bandwidth {copy / 1e9:.1f} GB/s, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| format | path | linear | us a call | GB/s | / copy | us a step |")
    print("|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        layers = [{name: random_weight(fmt, n, k) for name, (n, k) in LINEARS.items()} for _ in range(LAYERS)]
        head_fmt = EMBED_FORMAT[fmt]
        head = random_weight(head_fmt, *LM_HEAD)
        x8_layers = [{name: w.to_x8() for name, w in layer.items()} for layer in layers]
        x8_head = head.to_x8()
        paths = {
            "int16": (x8_layers, x8_head, ACT16),
            "int8": (x8_layers, x8_head, 0),
            "float": (layers, head, 0),
        }
        for path, (ws, hw, flag) in paths.items():
            step = [(name, w, w.code + flag) for layer in ws for name, w in layer.items()]
            step.append(("lm_head", hw, hw.code + flag))
            times = step_times(kernels, step, args.threads, args.steps)
            total = 0.0
            for name, us in times.items():
                n, k = LINEARS.get(name, LM_HEAD)
                calls = LAYERS if name in LINEARS else 1
                gbs = n * k * BYTES_PER_WEIGHT[head_fmt if name == "lm_head" else fmt] / us / 1e3
                total += us * calls
                print(
                    f"| {fmt} | {path} | {name} {k}->{n} | {us:.1f} | {gbs:.1f} | {gbs * 1e9 / copy:.2f}x | {us * calls:.0f} |"
                )
            print(f"| {fmt} | {path} | all linears | | | | **{total:.0f}** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
