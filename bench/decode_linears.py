"""Where a batch-1 decode step's linear time goes, per GGUF format and activation path, vs the copy bandwidth.

    python bench/decode_linears.py [--formats Q4_0,Q8_0,Q4_1] [--threads 2] [--steps 20] [--isa auto] [--pages huge]

The default model's linears at batch 1 (``qkv`` 576 -> 960, ``o`` 576 -> 576, ``gate_up``
576 -> 3072, ``down`` 1536 -> 576, 30 layers of each, then ``lm_head`` 576 -> 49152 in the
format of the file's token embedding), random weights of each format, called in a step's
order through ``lib.linear`` so every weight comes from memory as in a decode step. Three
activation paths: ``int16`` (the default, ``CK_ACT16`` on the x8 layout), ``int8``
(``CORE_CPU_QUANT_ACTIVATIONS=1``) and ``float`` (float32 activations on the blocks as
stored). Per linear: microseconds a call (the least of ``--steps`` steps: other jobs on a
shared machine only add), GB/s of weight bytes, and that against a float32 copy's bandwidth
(``floors.memory_bandwidth``, read + write counted). A call includes ctypes' ~1 us. The x8
weights lie in transparent huge pages as the engine places them (``--pages huge``,
:mod:`plugins.hugepages`) or in ordinary 4 KiB ones (``--pages 4k``; ``huge,4k``: both,
steps alternating, with the median ratio of their step totals). Not for CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch
from floors import memory_bandwidth
from linear_kernels import random_weight
from plugin_cpu_x86.platform import ISA_TABLE
from plugins.cpu_native.kernels import NativeCpuKernels
from plugins.cpu_native.library import ACT16, DTYPE_F32
from plugins.hugepages import HugePageArena

LAYERS = 30
LINEARS = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)
EMBED_FORMAT = {"Q4_0": "Q4_0", "Q8_0": "Q8_0", "Q4_1": "Q8_0"}  # bench/gguf_files.py's files
BYTES_PER_WEIGHT = {"Q4_0": 18 / 32, "Q4_1": 20 / 32, "Q8_0": 34 / 32}


def step_times(kernels: NativeCpuKernels, steps_of: dict[str, list], threads: int, steps: int) -> dict[str, list]:
    """``{variant: [{name: us a call}, ...] one a pass}`` over ``steps`` passes of each step of
    ``steps_of`` ({variant: [(name, weight, code)]}), the variants taking turns each pass."""
    any_step = next(iter(steps_of.values()))
    xs = {k: torch.randn(1, k) for k in {w.in_features for _, w, _ in any_step}}
    outs = {n: torch.empty(1, n) for n in {w.out_features for _, w, _ in any_step}}
    counts: dict[str, int] = {}
    for name, _, _ in any_step:
        counts[name] = counts.get(name, 0) + 1
    passes: dict[str, list] = {v: [] for v in steps_of}
    for i in range(steps + 1):
        for variant, step in steps_of.items():
            spent = dict.fromkeys(counts, 0)
            for name, w, code in step:
                n, k = w.out_features, w.in_features
                x, out = xs[k], outs[n]
                start = time.perf_counter_ns()
                kernels.lib.linear(code, w.data_ptr, None, n, k, DTYPE_F32, x.data_ptr(), k, 1, out.data_ptr(), None,
                                   DTYPE_F32, threads)  # fmt: skip
                spent[name] += time.perf_counter_ns() - start
            if i:  # the first pass warms up
                passes[variant].append({name: ns / 1e3 / counts[name] for name, ns in spent.items()})
    return passes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", default="Q4_0,Q8_0,Q4_1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--isa", default="auto", help="CPU_KERNEL_ISA")
    p.add_argument("--pages", default="huge", help="huge, 4k or huge,4k: where the x8 weights lie")
    args = p.parse_args()
    pages = args.pages.split(",")
    if not pages or set(pages) - {"huge", "4k"}:
        p.error(f"--pages takes huge, 4k or both, comma-separated, not {args.pages!r}")
    kernels = NativeCpuKernels(ISA_TABLE, args.isa, num_threads=args.threads)
    copy = memory_bandwidth(args.threads)
    print(f"kernels {kernels.isa}, {args.threads} thread(s), copy bandwidth {copy / 1e9:.1f} GB/s, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| format | path | pages | linear | us a call | GB/s | / copy | us a step |")
    print("|---|---|---|---|---|---|---|---|")
    arena = HugePageArena()

    def placed(w, where):  # the engine's placement (linear.py: _on_huge_pages) or ordinary memory
        return dataclasses.replace(w, data=arena.copy(w.data)) if where == "huge" else w

    for fmt in args.formats.split(","):
        layers = [{name: random_weight(fmt, n, k) for name, (n, k) in LINEARS.items()} for _ in range(LAYERS)]
        head_fmt = EMBED_FORMAT[fmt]
        head = random_weight(head_fmt, *LM_HEAD)
        x8 = {where: ([{name: placed(w.to_x8(), where) for name, w in layer.items()} for layer in layers],
                      placed(head.to_x8(), where)) for where in pages}  # fmt: skip
        paths = {"int16": (x8, ACT16), "int8": (x8, 0), "float": ({"4k": (layers, head)}, 0)}
        for path, (placements, flag) in paths.items():
            steps_of = {
                where: [(name, w, w.code + flag) for layer in ws for name, w in layer.items()]
                + [("lm_head", hw, hw.code + flag)]
                for where, (ws, hw) in placements.items()
            }
            passes = step_times(kernels, steps_of, args.threads, args.steps)
            for where, runs in passes.items():
                total = 0.0
                for name in runs[0]:
                    us = min(r[name] for r in runs)  # least of the passes: other jobs only add
                    n, k = LINEARS.get(name, LM_HEAD)
                    calls = LAYERS if name in LINEARS else 1
                    gbs = n * k * BYTES_PER_WEIGHT[head_fmt if name == "lm_head" else fmt] / us / 1e3
                    total += us * calls
                    print(f"| {fmt} | {path} | {where} | {name} {k}->{n} | {us:.1f} | {gbs:.1f} | "
                          f"{gbs * 1e9 / copy:.2f}x | {us * calls:.0f} |")  # fmt: skip
                print(f"| {fmt} | {path} | {where} | all linears | | | | **{total:.0f}** |")
            if len(passes) == 2:
                sums = {where: [sum(r[nm] * (LAYERS if nm in LINEARS else 1) for nm in r) for r in runs]
                        for where, runs in passes.items()}  # fmt: skip
                ratio = statistics.median(a / b for a, b in zip(sums["4k"], sums["huge"], strict=True))
                print(f"| {fmt} | {path} | 4k / huge | step, median of passes | | | | **{ratio:.2f}x** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
