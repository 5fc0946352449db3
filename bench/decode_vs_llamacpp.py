"""Batch-1 decode and prefill of this engine vs llama.cpp's llama-bench, per GGUF format, in one invocation.

    python bench/decode_vs_llamacpp.py [--threads 2] [--formats Q4_1,Q4_0,Q8_0] [--json out.json] [--results bench/RESULTS.md]

For each file (the default Q4_1 and the Q4_0/Q8_0 files of ``gguf_files.py``), back to
back: ``llama-bench -t T -p 128,512 -n 128 -r 3``, then this engine on its default path
(int16 activations on these files' blocks where the int8 kernel is vectorized, else float32
ones) and on int8 activations (``CORE_CPU_QUANT_ACTIVATIONS=1``), each in its own
subprocess: decode = 128 tokens after ``engine_part.decode_prompt`` (``engine_part.decode_tok_s``,
bench/'s one batch-1 decode method, the one ``cpu_vs_baselines.py`` uses; against the bandwidth
floor measured in the same subprocess, ``engine_part.decode_floor``), prefill = 4x128 and 1x512 prompts with one output token, no prefix cache.
Prints a markdown table with the ratios to llama.cpp's tg128 / pp512 (``--results``: also
into that file's ``decode-formats`` section, with the command, ISA and load). Not for CI.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODES = {"default": "0", "int8 act": "1"}


def llama_bench(bench: Path, model: Path, threads: int) -> dict[str, float]:
    """``{"pp128": tok/s, "pp512": ..., "tg128": ...}``: llama-bench's averages.

    A crash on its repacked weights (seen on an AMX Xeon: SIGSEGV in the AMX path) is retried
    with ``--repack 0``, and ``"repack": 0`` says so.
    """
    cmd = [str(bench), "-m", str(model), "-t", str(threads), "-p", "128,512", "-n", "128", "-r", "3", "-o", "json"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    extra = {}
    if result.returncode < 0:
        result = subprocess.run(cmd + ["--repack", "0"], capture_output=True, text=True)
        extra = {"repack": 0}
    if result.returncode:
        raise RuntimeError(f"llama-bench failed ({result.returncode}): {result.stderr[-2000:]}")
    rows = json.loads(result.stdout)
    return {(f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"): r["avg_ts"] for r in rows} | extra


def ours(model: str) -> dict[str, float]:
    """This engine on ``model`` (in this process): decode and prefill tok/s."""
    import engine_part
    from core.bench.throughput import run_throughput, vocab_of

    load, bandwidths = [os.getloadavg()[0]], [engine_part.copy_bandwidth()]
    llm = engine_part.make_llm(model, "gguf", prefix_caching=False)
    result = {"decode": engine_part.decode_tok_s(llm, engine_part.decode_prompt(vocab_of(llm)[0]), 128)}
    for name, (num, length) in {"pp 4x128": (4, 128), "pp512": (1, 512)}.items():
        best = 0.0
        for seed in range(2):
            tp = run_throughput(llm, num, length, 1, seed)
            best = max(best, tp.prompt_tokens / tp.elapsed_s)
        result[name] = best
    result["isa"] = llm.engine.platform.get_extension("kernel_isa")
    bandwidths.append(engine_part.copy_bandwidth())
    load.append(os.getloadavg()[0])
    result["decode_floor"] = engine_part.decode_floor(result["decode"], llm, bandwidths, load)
    return result


def ours_subprocess(model: Path, mode: str, threads: int) -> dict:
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "CORE_CPU_QUANT_ACTIVATIONS": MODES[mode]}
    cmd = [sys.executable, __file__, "--part", str(model)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if proc.returncode:
        return {"error": f"exit code {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: dict) -> str:
    lines = [
        "| file | llama.cpp pp128 / pp512 / tg128 | ours | pp 4x128 / pp512 / decode | decode / tg128 | pp512 / pp512 "
        "| decode / bandwidth floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for fmt, r in results.items():
        lc = r["llama.cpp"]
        for mode in MODES:
            o = r[mode]
            if "error" in o:
                lines.append(f"| {fmt} | | {mode} | failed: {o['error']} | | | |")
                continue
            lines.append(
                f"| {fmt}{' (llama.cpp --repack 0)' if lc.get('repack') == 0 else ''} | {lc['pp128']:.0f} / {lc['pp512']:.0f} / {lc['tg128']:.0f} | {mode} ({o['isa']}) | "
                f"{o['pp 4x128']:.0f} / {o['pp512']:.0f} / {o['decode']:.0f} | {o['decode'] / lc['tg128']:.2f}x | "
                f"{o['pp512'] / lc['pp512']:.2f}x | {o['decode_floor']['floor_ratio']:.2f}x "
                f"({o['decode_floor']['floor_tok_s']:.0f} tok/s) |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--formats", default="Q4_1,Q4_0,Q8_0")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument(
        "--llama-bench", type=Path, help="this llama-bench instead of the cached build's (another build of it)"
    )
    parser.add_argument("--results", type=Path, help="also put the table into this file's decode-formats section")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # internal: one engine run on this file
    a = parser.parse_args()
    if a.part:
        print(json.dumps(ours(a.part)))
        return 0
    import gguf_files
    import llamacpp

    bench = a.llama_bench or llamacpp.ensure_tools("llama-bench")["llama-bench"]
    files = gguf_files.ensure_gguf_files()
    load_before = os.getloadavg()[0]
    results = {}
    for fmt in a.formats.split(","):
        model = files[fmt]
        results[fmt] = {"llama.cpp": llama_bench(bench, model, a.threads)}
        for mode in MODES:
            results[fmt][mode] = ours_subprocess(model, mode, a.threads)
        print(f"{fmt}: {json.dumps(results[fmt])}", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    print(table(results))
    if a.results:
        from results import put_section

        header = (
            f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; "
            f"command: `python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n"
            f"- load average (1 min) before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f} "
            "(other jobs on the machine skew every figure, llama.cpp's most)\n\n"
        )
        text = a.results.read_text() if a.results.exists() else ""
        a.results.write_text(put_section(text, "decode-formats", header + table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
