"""Structured outputs on the default model: what a JSON-schema constraint costs, and llama.cpp's beside it.

In one invocation, on the 52 schemas of ``bench/json_schemas_bench.json`` (each with its prompt: the
test suite's 12, ``tests/data/json_schemas.json``, and 40 more of the kinds applications send):

1. ``--streams`` (32) concurrent greedy requests, each constrained by a schema, against the same
   prompts unconstrained and forced to the same number of output tokens: output tok/s of both
   and their ratio (prefill included on both sides alike), and how many answers validate;
2. the per-step mask cost: filling the packed bitmask of 32 matchers mid-answer and applying
   it through the platform's ``apply_token_bitmask``, in ms a step;
3. the compile's share of time to first token: a one-token request with a schema never seen
   (cold), the same again (cached), and unconstrained;
4. batch 1, schema by schema: our tok/s and validity against llama-server's ``json_schema``
   (its GBNF conversion) on the same GGUF file and threads (``--no-llamacpp`` skips it; the
   first run builds llama.cpp, see ``bench/llamacpp.py``).

``python bench/structured_outputs.py [--backend guidance|xgrammar] [--streams 32]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import torch
from core.loader.source import default_model_path

from core import LLM, SamplingParams, StructuredOutputsParams

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = json.loads((ROOT / "bench" / "json_schemas_bench.json").read_text())
MAX_TOKENS = 256


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def chat_prompt(llm: LLM, text: str) -> str:
    messages = [{"role": "user", "content": text}]
    return llm.get_tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def constrained(schema: dict, max_tokens: int = MAX_TOKENS) -> SamplingParams:
    spec = StructuredOutputsParams(json=schema)
    return SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=spec)


def throughput(llm: LLM, cases: list[dict], rounds: int = 3) -> dict:
    """Part 1: constrained against unconstrained at the same token counts, ``rounds`` times
    alternating (a noisy spell hits both sides); medians."""
    prompts = [chat_prompt(llm, c["prompt"]) for c in cases]
    outs = llm.generate(prompts, [constrained(c["schema"]) for c in cases], use_tqdm=False)  # compiles, warms up
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    free = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    times: dict[str, list[float]] = {"constrained": [], "unconstrained": []}
    for _ in range(rounds):
        for side, params in (("constrained", [constrained(c["schema"]) for c in cases]), ("unconstrained", free)):
            start = time.perf_counter()
            got = llm.generate(prompts, params, use_tqdm=False)
            times[side].append(time.perf_counter() - start)
            assert [len(o.outputs[0].token_ids) for o in got] == lengths
    tokens = sum(lengths)
    constrained_s, free_s = statistics.median(times["constrained"]), statistics.median(times["unconstrained"])
    return {
        "streams": len(cases),
        "output_tokens": tokens,
        "constrained_tok_s": tokens / constrained_s,
        "unconstrained_tok_s": tokens / free_s,
        "ratio": free_s / constrained_s,
        "valid": sum(valid(o.outputs[0].text, c["schema"]) for o, c in zip(outs, cases, strict=True)),
        "stopped": sum(o.outputs[0].finish_reason == "stop" for o in outs),
    }


def mask_cost(llm: LLM, cases: list[dict], repeats: int = 50) -> dict:
    """Part 2: one step's bitmask fill and apply for ``len(cases)`` matchers, each a few tokens into its answer."""
    engine = llm.engine
    prompts = [chat_prompt(llm, c["prompt"]) for c in cases]
    answers = llm.generate(prompts, [constrained(c["schema"]) for c in cases], use_tqdm=False)
    matchers = []
    for case, out in zip(cases, answers, strict=True):
        matcher = engine.structured.matcher(StructuredOutputsParams(json=case["schema"]))
        for token in out.outputs[0].token_ids[: len(out.outputs[0].token_ids) // 2]:
            assert matcher.accept(token)
        matchers.append(matcher)
    logits = torch.randn(len(matchers), engine.loaded.hf_config.vocab_size)
    fill, apply = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            bitmask, rows = engine.structured.bitmask(matchers)
            middle = time.perf_counter()
            engine.platform.kernels.apply_token_bitmask(logits, bitmask, rows)
            fill.append(middle - start)
            apply.append(time.perf_counter() - middle)
    return {"rows": len(matchers), "fill_ms": statistics.median(fill) * 1e3, "apply_ms": statistics.median(apply) * 1e3}


def ttft(llm: LLM, repeats: int = 5) -> dict:
    """Part 3: a one-token request's latency with a new schema, the same schema cached, and none."""
    prompt = chat_prompt(llm, SCHEMAS[0]["prompt"])

    def one(params: SamplingParams) -> float:
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - start

    cold, cached, free = [], [], []
    for i in range(repeats):
        schema = {**SCHEMAS[0]["schema"], "title": f"never seen {time.time()} {i}"}  # a new key: a fresh compile
        cold.append(one(constrained(schema, max_tokens=1)))
        cached.append(one(constrained(schema, max_tokens=1)))
        free.append(one(SamplingParams(temperature=0, max_tokens=1)))
    med = statistics.median
    return {"cold_ms": med(cold) * 1e3, "cached_ms": med(cached) * 1e3, "unconstrained_ms": med(free) * 1e3}


def refusal(llm: LLM, schema: dict) -> str | None:
    """Why the backend refuses ``schema`` (a keyword it would not enforce), or None."""
    try:
        llm.engine.structured.compile(StructuredOutputsParams(json=schema))
    except ValueError as exc:
        return str(exc)
    return None


def ours_batch1(llm: LLM) -> list[dict]:
    """Part 4, our side: each schema alone, greedy (or the backend's refusal)."""
    rows = []
    for case in SCHEMAS:
        why = refusal(llm, case["schema"])
        if why is not None:
            rows.append({"name": case["name"], "tok_s": None, "valid": False, "error": why[:200]})
            continue
        prompt = chat_prompt(llm, case["prompt"])
        start = time.perf_counter()
        (out,) = llm.generate([prompt], constrained(case["schema"]), use_tqdm=False)
        seconds = time.perf_counter() - start
        c = out.outputs[0]
        rows.append({"name": case["name"], "tok_s": len(c.token_ids) / seconds, "valid": valid(c.text, case["schema"])})
    return rows


def llamacpp_batch1(llm: LLM, threads: int) -> list[dict]:
    """Part 4, llama-server's side: ``/completion`` with ``json_schema``, one schema at a time."""
    sys.path.insert(0, str(ROOT / "bench"))
    from llamacpp import ensure_llamacpp

    server = ensure_llamacpp()["server"]
    port = 8931
    cmd = [str(server), "-m", str(default_model_path()), "-t", str(threads), "-np", "1", "-c", "2048",
           "--port", str(port), "--host", "127.0.0.1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        rows = []
        for case in SCHEMAS:
            body = {"prompt": chat_prompt(llm, case["prompt"]), "json_schema": case["schema"], "n_predict": MAX_TOKENS,
                    "temperature": 0, "cache_prompt": False}  # fmt: skip
            request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode())
            try:
                answer = json.loads(urllib.request.urlopen(request, timeout=300).read())
            except urllib.error.HTTPError as exc:  # a schema its converter refuses
                rows.append({"name": case["name"], "tok_s": None, "valid": False, "error": exc.read().decode()[:200]})
                continue
            rows.append(
                {
                    "name": case["name"],
                    "tok_s": answer["timings"]["predicted_per_second"],
                    "valid": valid(answer["content"], case["schema"]),
                }
            )
        return rows
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", choices=("auto", "guidance", "xgrammar"))
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--no-llamacpp", action="store_true")
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    llm = LLM(max_num_seqs=max(64, args.streams), max_model_len=2048, structured_outputs_backend=args.backend)
    accepted = [c for c in SCHEMAS if refusal(llm, c["schema"]) is None]
    cases = [accepted[i % len(accepted)] for i in range(args.streams)]
    report = {
        "backend": llm.engine.structured._get_backend().name,
        "schemas": len(SCHEMAS),
        "throughput": throughput(llm, cases),
        "mask": mask_cost(llm, cases),
        "ttft": ttft(llm),
        "ours_batch1": ours_batch1(llm),
    }
    if not args.no_llamacpp:
        report["llamacpp_batch1"] = llamacpp_batch1(llm, threads)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
