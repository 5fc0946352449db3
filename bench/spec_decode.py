"""Batch-1 greedy decode with and without speculative decoding, beside llama.cpp's, on the same GGUF files.

    python bench/spec_decode.py [--tokens 128] [--k 4] [--ngram-k 4,6,8] [--lookup-max 8] [--rounds 3] [--no-llamacpp]
        [--no-draft]
    python bench/spec_decode.py --profile   # one copy-heavy n-gram completion step by step
    python bench/spec_decode.py --replay    # n-gram steps of each workload's greedy output (load-independent)


The target is the default model (SmolLM2-135M-Instruct) as an F16 GGUF; the drafts are n-gram
lookup and the same model as Q4_0 (both files made by ``bench/gguf_files.py``). Two chat
workloads: copy-heavy (the model repeats a given function) and plain chat (a short poem).
``--ngram-k`` adds an n-gram engine for each of its
``num_speculative_tokens`` (``--k`` is the draft model's, llama.cpp's and the first n-gram engine's).
Each round runs every configuration once per workload, alternating, and the speed-up of a round is
its tokens/s over the same round's plain run; printed: the median tokens/s and the median speed-up
over ``--rounds`` rounds, and the share of draft tokens accepted. Speculative tokens are checked
equal to the plain run's. llama.cpp runs as ``llama-server`` (the bench cache's build) with
``--spec-type ngram-simple`` and ``--spec-type draft-simple -md Q4_0``, 2 threads, requests timed
the same way (wall time of one chat completion); its n-gram size is ``--llamacpp-ngram-n``.
``--profile`` prints, for one copy-heavy completion with n-gram drafts, each step's query rows,
drafts proposed and accepted, the target step's time (forward and logits) and the host time
around it, then the target step's time by query rows, 1 to 8 or k + 1 (drafts forced, all rejected).
``--replay`` decodes each workload once without speculation and replays its greedy output through
the engine's n-gram proposer (``SpecDecoder``: the steps, drafts and accepted drafts a speculative
run takes, timing aside), beside an oracle that at each step takes the best continuation of any
recurring suffix at exactly the length accepted; the steps where the oracle got more are counted
by cause, and a speed-up is modelled from ``--row-costs`` (a verify step's cost by query rows, in
plain steps). Not for CI.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gguf_files  # noqa: E402
import llamacpp  # noqa: E402
import serve_part  # noqa: E402
from core.sequence import Sequence  # noqa: E402
from core.spec_decode import SpecDecoder, SpeculativeConfig, num_accepted  # noqa: E402

from core import LLM, SamplingParams  # noqa: E402

TEXT = (
    "def merge_sort(items):\n    if len(items) <= 1:\n        return items\n    middle = len(items) // 2\n"
    "    left = merge_sort(items[:middle])\n    right = merge_sort(items[middle:])\n    merged = []\n"
    "    while left and right:\n        merged.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n"
    "    return merged + left + right\n"
)
#: --profile times target steps of 1 to this many query rows (at least k + 1)
PROFILE_ROWS = 8
WORKLOADS = {
    "copy-heavy": [{"role": "user", "content": f"Repeat this code exactly, with no comment:\n\n{TEXT}"}],
    "plain chat": [{"role": "user", "content": "Write a short poem about the sea."}],
}


def ours(llm: LLM, messages: list[dict], params: SamplingParams) -> tuple[float, list[int]]:
    """Tokens/s of one chat completion (wall time, prefill included) and its tokens."""
    started = time.perf_counter()
    out = llm.chat([messages], params, use_tqdm=False)[0].outputs[0]
    return len(out.token_ids) / (time.perf_counter() - started), list(out.token_ids)


def llama(url: str, messages: list[dict], tokens: int) -> tuple[float, str, tuple[int, int]]:
    """Tokens/s of one greedy chat completion by llama-server (wall time), its text, (drafted, accepted)."""
    import httpx

    body = {"messages": messages, "max_tokens": tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": True}
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).json()
    elapsed = time.perf_counter() - started
    timings = reply.get("timings", {})
    drafted = (timings.get("draft_n", 0), timings.get("draft_n_accepted", 0))
    return reply["usage"]["completion_tokens"] / elapsed, reply["choices"][0]["message"]["content"], drafted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument(
        "--ngram-k", default="", help="n-gram engines' num_speculative_tokens, comma-separated (default: --k)"
    )
    parser.add_argument("--lookup-max", type=int, default=8, help="prompt_lookup_max (prompt_lookup_min 1)")
    parser.add_argument("--llamacpp-ngram-n", type=int, default=3, help="llama.cpp's --spec-ngram-simple-size-n")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-llamacpp", action="store_true")
    parser.add_argument("--no-draft", action="store_true", help="leave out our Q4_0 draft model")
    parser.add_argument("--profile", action="store_true", help="profile one copy-heavy n-gram completion")
    parser.add_argument("--replay", action="store_true", help="replay each workload's output through the proposer")
    parser.add_argument(
        "--row-costs",
        default="1,1.03,1.18,1.37,1.47",
        help="--replay's verify step cost by query rows 1, 2, ... in plain steps (+0.1 a row beyond)",
    )
    args = parser.parse_args()
    files = gguf_files.ensure_gguf_files(("Q4_0", "F16"))
    target, draft = str(files["F16"]), str(files["Q4_0"])

    def ngram(k: int) -> dict:
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                "prompt_lookup_max": args.lookup_max}  # fmt: skip

    ngram_ks = [int(k) for k in args.ngram_k.split(",")] if args.ngram_k else [args.k]
    configs = {"ngram" if k == args.k else f"ngram k={k}": ngram(k) for k in ngram_ks}
    if not args.no_draft:
        configs["Q4_0 draft"] = {"method": "draft_model", "model": draft, "num_speculative_tokens": args.k}
    kw = dict(model=target, max_model_len=1024, max_num_seqs=1)
    if args.profile:
        profile(LLM(speculative_config=ngram(args.k), **kw), args)
        return 0
    if args.replay:
        replay(LLM(**kw), ngram(args.k), args)
        return 0
    engines = {"off": LLM(**kw)} | {name: LLM(speculative_config=c, **kw) for name, c in configs.items()}
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    rates: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for workload, messages in WORKLOADS.items():
            want = None
            for name, llm in engines.items():
                rate, tokens = ours(llm, messages, params)
                if want is None:
                    want = tokens
                elif tokens != want:
                    raise SystemExit(f"{workload}, {name}: speculative tokens differ from the plain run's")
                rates.setdefault((workload, name), []).append(rate)
    with os.popen("uptime") as up:
        load = up.read().strip()
    print(f"target {Path(target).name}; batch 1, greedy, up to {args.tokens} tokens, k={args.k}, "
          f"n-gram lookup 1..{args.lookup_max}; median of {args.rounds} alternating rounds; {load}")  # fmt: skip
    print(f"{'workload':<11} {'method':<16} {'tok/s':>7} {'speed-up':>9} {'accepted':>9}")
    for workload in WORKLOADS:
        for name, llm in engines.items():
            runs = rates[(workload, name)]
            ratios = [r / off for r, off in zip(runs, rates[(workload, "off")], strict=True)]
            accepted = "-"
            if llm.engine.spec is not None:
                s = llm.engine.spec.stats()
                accepted = f"{100 * s['num_accepted_tokens'] / max(s['num_draft_tokens'], 1):.0f}%*"
            print(f"{workload:<11} {'core ' + name:<16} {statistics.median(runs):>7.1f} "
                  f"{statistics.median(ratios):>8.2f}x {accepted:>9}")  # fmt: skip
    print("* accepted: over both workloads")
    if not args.no_llamacpp:
        llama_cpp(target, draft, args)
    return 0


def profile(llm: LLM, args: argparse.Namespace) -> None:
    """One copy-heavy completion with n-gram drafts, step by step, then the target step's time by query rows."""
    engine, runner = llm.engine, llm.engine.executor.runner
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    timers: dict[str, float] = {}

    def timed(name: str, fn):
        def call(*a, **kw):
            started = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers[name] = timers.get(name, 0.0) + time.perf_counter() - started

        return call

    runner.forward, runner.logits = timed("forward", runner.forward), timed("logits", runner.logits)
    engine.executor.execute = timed("execute", engine.executor.execute)
    ngram = engine.spec.propose

    def complete(propose) -> list[tuple[int, int, dict[str, float]]]:
        """(drafts, accepted, timers) of each decode step of one completion (its prefill step left out)."""
        engine.spec.propose = timed("propose", propose)
        steps = []
        prompt = engine.apply_chat_template(WORKLOADS["copy-heavy"], add_generation_prompt=True)
        engine.add_request("profile", prompt_token_ids=prompt, params=params)
        while engine.has_unfinished_requests():
            timers.clear()
            before = (engine.spec.num_draft_tokens, engine.spec.num_accepted_tokens)
            started = time.perf_counter()
            engine.step()
            timers["step"] = time.perf_counter() - started
            drafted, accepted = engine.spec.num_draft_tokens - before[0], engine.spec.num_accepted_tokens - before[1]
            steps.append((drafted, accepted, dict(timers)))
        return steps[1:]

    complete(ngram)  # warm-up; the prompt is in the prefix cache from here on
    steps = complete(ngram)
    with os.popen("uptime") as up:
        load = up.read().strip()
    print(f"copy-heavy, n-gram k={args.k} lookup 1..{args.lookup_max}, {args.tokens} tokens; {load}")
    print("ms; host = the step less the target's execute (propose, schedule, batch, sample, record)")
    print(f"{'step':>4} {'rows':>4} {'drafts':>6} {'acc':>3} {'forward':>8} {'logits':>7} {'host':>6} {'propose':>8}")
    for i, (drafted, accepted, t) in enumerate(steps):
        host = t["step"] - t["execute"]
        print(f"{i:>4} {drafted + 1:>4} {drafted:>6} {accepted:>3} {1e3 * t['forward']:>8.2f} "
              f"{1e3 * t['logits']:>7.2f} {1e3 * host:>6.2f} {1e3 * t['propose']:>8.3f}")  # fmt: skip
    tokens = sum(accepted + 1 for _, accepted, _ in steps)
    total = sum(t["step"] for *_, t in steps)
    print(f"{len(steps)} steps, {tokens} tokens, {tokens / total:.1f} tok/s over the decode steps")
    print("\ntarget step by query rows (drafts forced: the last token repeated, all rejected); median ms, "
          "and the fastest step (steadier than the median on a loaded machine)")  # fmt: skip
    print(
        f"{'rows':>4} {'forward':>8} {'logits':>7} {'host':>6} {'step':>7} {'vs 1 row':>8} {'min step':>8} {'vs 1 row':>8}"
    )
    one = fastest = None
    for rows in range(1, max(args.k + 1, PROFILE_ROWS) + 1):

        def force(seqs, matcher, n=rows - 1):
            return {seq.seq_id: [seq.token_ids[-1]] * n for seq in seqs} if n else {}

        timing = [t for _, _, t in complete(force)]
        med = {key: statistics.median(t[key] for t in timing) for key in ("forward", "logits", "step")}
        host = statistics.median(t["step"] - t["execute"] for t in timing)
        low = min(t["step"] for t in timing)
        one, fastest = one or med["step"], fastest or low
        print(f"{rows:>4} {1e3 * med['forward']:>8.2f} {1e3 * med['logits']:>7.2f} {1e3 * host:>6.2f} "
              f"{1e3 * med['step']:>7.2f} {med['step'] / one:>7.2f}x {1e3 * low:>8.2f} {low / fastest:>7.2f}x")  # fmt: skip
    engine.spec.propose = ngram


def replay(llm: LLM, config: dict, args: argparse.Namespace) -> None:
    """Each workload's greedy output replayed through the n-gram proposer, beside the oracle's steps."""
    costs = [float(c) for c in args.row_costs.split(",")]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    print(f"n-gram k={args.k} lookup 1..{args.lookup_max}, {args.tokens} tokens; row costs {args.row_costs}")
    print(f"{'workload':<11} {'tokens':>6} {'steps':>5} {'drafts':>6} {'accepted':>8} {'modelled':>8} "
          f"{'oracle':>6}  oracle ahead at: {'no drafts':>11} {'too short':>11} {'other occ.':>11}")  # fmt: skip
    for workload, messages in WORKLOADS.items():
        prompt = list(llm.engine.apply_chat_template(messages, add_generation_prompt=True))
        output = list(llm.chat([messages], params, use_tqdm=False)[0].outputs[0].token_ids)
        steps = replay_steps(prompt, output, SpeculativeConfig.from_dict(config))
        oracle, position = 0, 1  # the oracle's steps; output[0] is the prefill step's token
        while position < len(output):
            position += best_continuation(prompt + output[:position], output[position:], args.k) + 1
            oracle += 1
        behind = {"no drafts": [0, 0], "too short": [0, 0], "other occ.": [0, 0]}
        for position, drafts, accepted in steps:
            best = best_continuation(prompt + output[:position], output[position:], args.k)
            if best > accepted:
                cause = "no drafts" if not drafts else "too short" if accepted == drafts else "other occ."
                behind[cause][0] += 1
                behind[cause][1] += best - accepted
        cost = sum(costs[d] if d < len(costs) else costs[-1] + 0.1 * (d + 1 - len(costs)) for _, d, _ in steps)
        causes = " ".join(f"{f'{n} ({t} tok)':>11}" for n, t in behind.values())
        print(f"{workload:<11} {len(output) - 1:>6} {len(steps):>5} {sum(d for _, d, _ in steps):>6} "
              f"{sum(a for *_, a in steps):>8} {(len(output) - 1) / cost:>7.2f}x {oracle:>6}  {'':>16} {causes}")  # fmt: skip
    print(
        "tokens: after the prefill's; modelled: tokens / the steps' row costs; oracle ahead at: the replay's steps "
        "where the oracle would have accepted more (how many, the tokens it would have gained)"
    )


def replay_steps(prompt: list[int], output: list[int], config: SpeculativeConfig) -> list[tuple[int, int, int]]:
    """(output position, drafts, accepted) of each decode step a greedy n-gram run of ``output`` takes."""
    spec = SpecDecoder(config, max_model_len=len(prompt) + len(output) + 1)
    seq = Sequence(0, "replay", list(prompt), SamplingParams(temperature=0.0, max_tokens=len(output)), 0.0)
    seq.append_token(output[0])  # the prefill step's token
    steps = []
    while seq.num_output_tokens < len(output):
        drafts = spec.propose([seq], lambda _: None).get(seq.seq_id, [])
        upcoming = output[seq.num_output_tokens :]
        accepted = num_accepted(upcoming, drafts)
        if drafts:
            spec.record(seq.seq_id, len(drafts), accepted)
        steps.append((seq.num_output_tokens, len(drafts), accepted))
        for token in upcoming[: accepted + 1]:
            seq.append_token(token)
    return steps


def best_continuation(tokens: list[int], upcoming: list[int], k: int) -> int:
    """Most of ``upcoming`` (up to ``k``) that the tokens after any earlier occurrence of any suffix of ``tokens`` give."""
    best = 0
    for n in range(1, len(tokens)):
        starts = [s + n for s in range(len(tokens) - n) if tokens[s : s + n] == tokens[-n:]]
        if not starts:
            return best
        for start in starts:
            best = max(best, num_accepted(upcoming, tokens[start : start + min(k, len(upcoming))]))
    return best


def llama_cpp(target: str, draft: str, args: argparse.Namespace) -> None:
    """The same workloads through llama-server, without and with each speculation type."""
    server = llamacpp.ensure_tools("llama-server")["llama-server"]
    base = [str(server), "-m", target, "--port", "{port}", "-t", "2", "-tb", "2", "-c", "2048", "-np", "1"]
    kinds = {
        "off": [],
        "ngram": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(args.llamacpp_ngram_n),
                  "--spec-ngram-simple-size-m", str(args.k)],
        "Q4_0 draft": ["--spec-type", "draft-simple", "-md", draft, "--spec-draft-n-max", str(args.k), "-td", "2"],
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, extra in kinds.items():
            try:
                urls[name] = stack.enter_context(serve_part.server(base + extra, f"llama-server ({name})"))
            except RuntimeError as exc:
                print(f"llama.cpp {name}: could not run: {str(exc).splitlines()[0][:300]}")
        rates: dict[tuple[str, str], list[float]] = {}
        drafts: dict[str, list[int]] = {name: [0, 0] for name in urls}
        texts: dict[tuple[str, str], str] = {}
        for _ in range(args.rounds):
            for workload, messages in WORKLOADS.items():
                for name, url in urls.items():
                    rate, text, (drafted, accepted) = llama(url, messages, args.tokens)
                    rates.setdefault((workload, name), []).append(rate)
                    drafts[name][0] += drafted
                    drafts[name][1] += accepted
                    texts[(workload, name)] = text
    with os.popen("uptime") as up:
        print(f"llama.cpp llama-server, 2 threads; {up.read().strip()}")
    for workload in WORKLOADS:
        for name in urls:
            runs = rates[(workload, name)]
            ratio = "-"
            if "off" in urls:
                ratio = f"{statistics.median(r / o for r, o in zip(runs, rates[(workload, 'off')], strict=True)):.2f}x"
            same = "" if texts[(workload, name)] == texts.get((workload, "off")) else " (text differs from off)"
            accepted = f"{100 * drafts[name][1] / drafts[name][0]:.0f}%*" if drafts[name][0] else "-"
            print(f"{workload:<11} {'llama.cpp ' + name:<21} {statistics.median(runs):>7.1f} {ratio:>9} "
                  f"{accepted:>9}{same}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
