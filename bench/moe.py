"""Mixture-of-experts decode and throughput: a ~1B Qwen3-MoE of random weights (8 experts, 2 active)
through this engine, transformers and llama.cpp, in one invocation.

    python bench/moe.py [--threads 2] [--decode-rounds 5] [--rounds 3] [--formats F16,Q8_0,Q4_0]
                        [--decode-tokens 32] [--streams 32] [--prompt 32] [--tokens 32]
                        [--int8-act] [--results bench/RESULTS.md]

The model (made once under ``~/.cache/core-bench/moe-qwen3``, ``CORE_BENCH_CACHE``): a
``Qwen3MoeConfig`` with the default model's tokenizer (49152 ids), hidden 1024, 24 layers, all
sparse, 16 query / 4 KV heads of 64, 8 experts of intermediate 1536, top 2 renormalized, tied
embeddings: 1.02B parameters, 0.34B active per token (lm_head included). Random weights
(transformers' initializer, seed 0), saved as a float32 Hugging Face folder, converted by
llama.cpp's own ``convert_hf_to_gguf.py --outtype f16`` and quantized by ``llama-quantize
--pure`` to each of ``--formats`` (the cached build of bench/llamacpp.py).

Measured, each system in its own process (loaded once), alternating within each round (the
order reversed every other round, so neither side always runs first):

* the folder (float32): this engine vs transformers (``torch.set_num_threads(--threads)``):
  batch-1 decode (``--decode-tokens`` after a 16-token prompt, best of two a round) and
  ``--streams`` prompts of ``--prompt`` random ids generating ``--tokens`` each (output tok/s,
  prefill included), the same prompts on both sides; greedy tokens compared first;
* each GGUF file: this engine (``quantization="gguf"``) vs ``llama-bench -n 128`` (tg128)
  and ``llama-batched-bench`` on the same streams;
* with ``--int8-act``, each GGUF file's batch-1 decode also with ``CORE_CPU_QUANT_ACTIVATIONS=1``
  (activations rounded to int8 per block of 32 for the quantized products, as llama.cpp rounds them
  to Q8_0; not the default, which keeps them to 2^-16 of a block's largest) in the same decode
  rounds, its greedy tokens compared with the default's;
* the floor: bytes of the *active* parameters a decode step reads (every expert stack times
  top_k / num_experts, the rest whole, the tied embedding as lm_head) over the copy
  bandwidth (bench/floors.py).

The batch-1 decode figures take ``--decode-rounds`` rounds of their own (at least 3, default 5:
one decode is a few seconds, and a single pair of rounds moved a ratio by 20% on this shared
machine), the stream figures ``--rounds``. Each figure is the median over rounds, each ratio the
median of the per-round ratios; the table goes to stdout and,
with ``--results``, into that file's ``moe`` section. transformers' 32 streams are the slow part
(float32, ~1 output tok/s at load 15 here): expect half an hour or more for the defaults. Not for CI.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import llamacpp  # noqa: E402

#: the model's shape (see the module docstring)
SHAPE = dict(
    hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1536, intermediate_size=4096,
    decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=True,
    max_position_embeddings=4096, rope_theta=1e6,
)  # fmt: skip
DECODE_PROMPT = list(range(100, 116))
BYTES = {"F32": 4, "F16": 2, "BF16": 2}
GREEDY_TOKENS = 16


def ensure_model() -> Path:
    """The float32 Hugging Face folder of the bench model, made once."""
    out = llamacpp.cache_dir() / "moe-qwen3"
    if (out / "config.json").exists():
        return out
    import torch
    import transformers
    from core.loader import default_model_path
    from core.loader.gguf_model import gguf_tokenizer

    tokenizer = gguf_tokenizer(default_model_path(), None)
    config = transformers.Qwen3MoeConfig(
        **SHAPE, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return out


def ensure_gguf(folder: Path, formats: list[str]) -> dict[str, Path]:
    """``{fmt: path}``: the folder as an F16 GGUF (llama.cpp's converter) and ``llama-quantize --pure`` files."""
    cache, log = llamacpp.cache_dir(), llamacpp.cache_dir() / "setup.log"
    files = {fmt: folder.parent / f"{folder.name}.{fmt}.gguf" for fmt in ["F16", *formats]}
    if not files["F16"].exists():
        (convert,) = sorted((cache / "src").glob("*/vendor/llama.cpp/convert_hf_to_gguf.py"))[-1:]
        tmp = files["F16"].with_suffix(".tmp")
        llamacpp.run_logged([sys.executable, str(convert), str(folder), "--outtype", "f16", "--outfile", str(tmp)], log)
        tmp.rename(files["F16"])
    missing = [fmt for fmt in formats if not files[fmt].exists()]
    if missing:
        quantize = llamacpp.ensure_tools("llama-quantize")["llama-quantize"]
        for fmt in missing:
            tmp = files[fmt].with_suffix(".tmp")
            llamacpp.run_logged([str(quantize), "--pure", str(files["F16"]), str(tmp), fmt, "2"], log)
            tmp.rename(files[fmt])
    return {fmt: files[fmt] for fmt in formats}


def active_bytes_gguf(path: Path) -> tuple[int, int]:
    """``(bytes a decode step reads, bytes of every tensor)`` of a GGUF file's weights as stored."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    experts = int(reader.fields[f"{arch}.expert_count"].parts[-1][0])
    used = int(reader.fields[f"{arch}.expert_used_count"].parts[-1][0])
    names = {t.name for t in reader.tensors}
    total = active = 0
    for t in reader.tensors:
        size = int(t.n_bytes)
        total += size
        if "_exps." in t.name:
            active += size * used // experts
        elif t.name != "token_embd.weight" or "output.weight" not in names:  # untied: one embedding row
            active += size
    return active, total


def active_bytes_folder(folder: Path) -> tuple[int, int]:
    """The same for a safetensors folder (float32): every expert's tensor counts top_k / num_experts."""
    from safetensors import safe_open
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    share = config.num_experts_per_tok / config.num_experts
    total = active = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                part = f.get_slice(name)
                size = BYTES[part.get_dtype()]
                for dim in part.get_shape():
                    size *= dim
                total += size
                active += int(size * share) if ".experts." in name else size
    return active, total


# -- the measured systems, each a long-lived worker process --------------------------------------


def worker_main(kind: str, model: str, threads: int) -> None:
    """Serve ``decode``, ``batch`` and ``greedy`` requests (JSON lines on stdin) for one loaded model."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # libraries' prints go to stderr: stdout carries the answers
    import torch

    if kind == "hf":
        import hf_baseline
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        model_obj = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

        def decode(n: int) -> float:
            return hf_baseline.decode_tok_s(model_obj, DECODE_PROMPT, n)

        def batch(prompts: list[list[int]], n: int) -> float:
            return hf_baseline.batched_gen_tok_s(model_obj, prompts, n)["output_tok_s"]

        def greedy(prompt: list[int], n: int) -> list[int]:
            ids = torch.tensor([prompt])
            with torch.inference_mode():
                made = model_obj.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                          min_new_tokens=n, do_sample=False, pad_token_id=0)  # fmt: skip
            return made[0, len(prompt) :].tolist()
    else:
        import engine_part
        from core.sampling_params import SamplingParams

        from core import LLM

        llm = LLM(model, device="auto", dtype="float32", quantization="gguf" if kind == "core-gguf" else None,
                  enable_prefix_caching=False, max_num_batched_tokens=2048, max_model_len=1024,
                  kv_cache_bytes=768 << 20, skip_tokenizer_init=True)  # fmt: skip
        core_threads = torch.get_num_threads()

        def decode(n: int) -> float:
            torch.set_num_threads(core_threads)
            return engine_part.decode_tok_s(llm, DECODE_PROMPT, n)

        def run(prompts: list[list[int]], n: int):
            params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
            return llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)

        def batch(prompts: list[list[int]], n: int) -> float:
            run(prompts[:1], 2)  # warm-up
            start = time.perf_counter()
            run(prompts, n)
            return len(prompts) * n / (time.perf_counter() - start)

        def greedy(prompt: list[int], n: int) -> list[int]:
            return list(run([prompt], n)[0].outputs[0].token_ids)

    ops = {"decode": lambda r: decode(r["tokens"]), "batch": lambda r: batch(r["prompts"], r["tokens"]),
           "greedy": lambda r: greedy(r["prompt"], r["tokens"])}  # fmt: skip
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out.write(json.dumps({"result": ops[request["op"]](request)}) + "\n")
        out.flush()


class Worker:
    """A worker process for one system on one model; ``ask`` sends a request and waits for its answer."""

    def __init__(self, kind: str, model: Path, threads: int, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, __file__, "--worker", kind, "--model", str(model), "--threads", str(threads)]
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "TQDM_DISABLE": "1"} | (env or {})
        self.kind = kind
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} worker exited ({self.proc.wait()}); its log is above")
        return json.loads(line)

    def ask(self, op: str, **args):
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self._read()["result"]

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def llama_tg(bench: Path, model: Path, threads: int) -> float:
    """llama-bench's tg128 tok/s (one repetition)."""
    cmd = [str(bench), "-m", str(model), "-t", str(threads), "-p", "0", "-n", "128", "-r", "1", "-o", "json"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"llama-bench failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout)[0]["avg_ts"]


def llama_batched(bench: Path, model: Path, threads: int, streams: int, prompt: int, tokens: int) -> float:
    """llama-batched-bench's output tok/s (prefill included) for ``streams`` x (``prompt`` + ``tokens``)."""
    (row,) = llamacpp.batched_bench(bench, str(model), threads, prompt, tokens, [streams])
    return row["pl"] * row["tg"] / row["t"]


def run_rounds(rounds: int, steps: dict) -> dict[str, list[float]]:
    """Each step (name -> zero-argument call) once a round, in order on even rounds and in reverse on
    odd ones; every value and the load at each round (as ``load``)."""
    values: dict[str, list[float]] = {name: [] for name in steps} | {"load": []}
    for number in range(rounds):
        values["load"].append(os.getloadavg()[0])
        for name, step in list(steps.items())[:: 1 if number % 2 == 0 else -1]:
            values[name].append(step())
        print(f"round {number + 1}: {json.dumps({k: round(v[-1], 2) for k, v in values.items()})}", file=sys.stderr)
    return values


def decode_then_batch(decode_rounds: int, rounds: int, decode: dict, batch: dict) -> dict[str, list[float]]:
    """The decode steps' rounds, then the batch steps' rounds (:func:`run_rounds`); the loads as
    ``decode load`` and ``batch load``."""
    first, second = run_rounds(decode_rounds, decode), run_rounds(rounds, batch)
    return first | second | {"decode load": first.pop("load"), "batch load": second.pop("load")}


def median_ratio(values: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(values[a], values[b], strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-rounds", type=int, default=5, help="rounds of the batch-1 decode figures (>= 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the stream figures")
    parser.add_argument("--formats", default="F16,Q8_0,Q4_0")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--no-hf", action="store_true", help="skip transformers (the folder's core figures stay)")
    parser.add_argument("--int8-act", action="store_true", help="also decode each GGUF file with int8 activations")
    parser.add_argument("--results", type=Path, help="also put the table into this file's moe section")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: serve one system
    parser.add_argument("--model", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        worker_main(a.worker, a.model, a.threads)
        return 0
    if a.decode_rounds < 3:
        parser.error(f"--decode-rounds takes 3 or more (a median of alternating rounds), got {a.decode_rounds}")

    from core.bench.stats import random_prompts
    from floors import machine_info, memory_bandwidth

    formats = [f for f in a.formats.split(",") if f]
    folder = ensure_model()
    files = ensure_gguf(folder, formats)
    tools = llamacpp.ensure_tools("llama-bench")
    batched = llamacpp.ensure_llamacpp()["bench"]
    config = json.loads((folder / "config.json").read_text())
    prompts = random_prompts(a.streams, a.prompt, config["vocab_size"], seed=0, exclude=[config["eos_token_id"]])
    started, load_before = datetime.datetime.now(datetime.timezone.utc), os.getloadavg()[0]
    bandwidth = memory_bandwidth(a.threads)
    rows, notes = [], []

    # the float32 folder: this engine vs transformers
    active, total = active_bytes_folder(folder)
    with Worker("core", folder, a.threads) as core:
        decode = {"core decode": lambda: core.ask("decode", tokens=a.decode_tokens)}
        batch = {"core batch": lambda: core.ask("batch", prompts=prompts, tokens=a.tokens)}
        if a.no_hf:
            values = decode_then_batch(a.decode_rounds, a.rounds, decode, batch)
        else:
            with Worker("hf", folder, a.threads) as hf:
                ours, theirs = (w.ask("greedy", prompt=DECODE_PROMPT, tokens=GREEDY_TOKENS) for w in (core, hf))
                same = next((i for i, (x, y) in enumerate(zip(ours, theirs, strict=True)) if x != y), None)
                notes.append(f"greedy {GREEDY_TOKENS} tokens on the folder, core vs transformers: "
                             + ("equal" if same is None else f"first difference at token {same}"))  # fmt: skip
                decode["hf decode"] = lambda: hf.ask("decode", tokens=a.decode_tokens)
                batch["hf batch"] = lambda: hf.ask("batch", prompts=prompts, tokens=a.tokens)
                values = decode_then_batch(a.decode_rounds, a.rounds, decode, batch)
    rows.append(("folder (float32)", active, total, values, "hf"))

    for fmt, path in files.items():
        active, total = active_bytes_gguf(path)
        with contextlib.ExitStack() as stack:
            core = stack.enter_context(Worker("core-gguf", path, a.threads))
            decode = {
                "llama decode": lambda path=path: llama_tg(tools["llama-bench"], path, a.threads),
                "core decode": lambda core=core: core.ask("decode", tokens=a.decode_tokens),
            }
            if a.int8_act:
                int8 = stack.enter_context(Worker("core-gguf", path, a.threads, {"CORE_CPU_QUANT_ACTIVATIONS": "1"}))
                ours, theirs = (w.ask("greedy", prompt=DECODE_PROMPT, tokens=GREEDY_TOKENS) for w in (int8, core))
                same = next((i for i, (x, y) in enumerate(zip(ours, theirs, strict=True)) if x != y), None)
                notes.append(f"greedy {GREEDY_TOKENS} tokens on {fmt}, int8 activations vs the default: "
                             + ("equal" if same is None else f"first difference at token {same}"))  # fmt: skip
                decode["core int8 decode"] = lambda int8=int8: int8.ask("decode", tokens=a.decode_tokens)
            batch = {
                "llama batch": lambda path=path: llama_batched(batched, path, a.threads, a.streams, a.prompt, a.tokens),
                "core batch": lambda core=core: core.ask("batch", prompts=prompts, tokens=a.tokens),
            }
            values = decode_then_batch(a.decode_rounds, a.rounds, decode, batch)
        rows.append((f"GGUF {fmt}", active, total, values, "llama"))
        if a.int8_act:
            int8_values = {"core decode": values["core int8 decode"], "llama decode": values["llama decode"],
                           "decode load": values["decode load"]}  # fmt: skip
            rows.append((f"GGUF {fmt}, int8 activations", active, total, int8_values, "llama"))

    table = render(rows, bandwidth, a.streams)
    info = machine_info()
    header = (
        f"- date: {started.isoformat(timespec='seconds')}; command: `python bench/{Path(__file__).name} "
        f"{' '.join(sys.argv[1:])}` (decode rounds: {a.decode_rounds}, stream rounds: {a.rounds})\n- CPU: {info['cpu']} ({info['flags']}), {a.threads} threads; "
        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; load average (1 min) before / after: "
        f"{load_before:.1f} / {os.getloadavg()[0]:.1f}\n"
        f"- model: Qwen3-MoE, random weights: {json.dumps(SHAPE)}, vocab {config['vocab_size']}\n"
        f"- decode: {a.decode_tokens} tokens after a 16-token prompt (llama.cpp: llama-bench tg128); "
        f"{a.streams} streams: {a.prompt}-token random prompts, {a.tokens} tokens each, output tok/s incl. prefill\n"
        + "".join(f"- {note}\n" for note in notes)
    )
    print(header + "\n" + table)
    if a.results:
        from results import put_section

        text = a.results.read_text() if a.results.exists() else ""
        a.results.write_text(put_section(text, "moe", "## MoE (issue 46)\n\n" + header + "\n" + table))
    return 0


def render(rows: list, bandwidth: float, streams: int) -> str:
    """The markdown table: per model form, medians over rounds (ratios are medians of per-round ratios)."""
    lines = [
        "| weights | total / active MB | active floor tok/s | core decode tok/s | / floor | baseline decode | core / baseline "
        f"| core {streams}-stream tok/s | baseline {streams}-stream | core / baseline | load at each decode round "
        "| core / baseline decode each round |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, active, total, values, other in rows:
        floor = bandwidth / active
        decode = statistics.median(values["core decode"])
        cells = [
            name,
            f"{total / 1e6:.0f} / {active / 1e6:.0f}",
            f"{floor:.1f}",
            f"{decode:.1f}",
            f"{decode / floor:.2f}x",
        ]
        label = "transformers" if other == "hf" else "llama.cpp"
        for kind in ("decode", "batch"):
            if f"{other} {kind}" in values:
                theirs = statistics.median(values[f"{other} {kind}"])
                ratio = median_ratio(values, f"core {kind}", f"{other} {kind}")
                cells += [f"{label} {theirs:.1f}", f"{ratio:.2f}x"]
            else:
                cells += ["n/a", "n/a"]
            if kind == "decode":
                cells.append(f"{statistics.median(values['core batch']):.1f}" if "core batch" in values else "n/a")
        cells.append(", ".join(f"{x:.1f}" for x in values["decode load"]))
        if f"{other} decode" in values:
            pairs = zip(values["core decode"], values[f"{other} decode"], strict=True)
            cells.append(", ".join(f"{x / y:.2f}" for x, y in pairs))
        else:
            cells.append("n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
