"""Serving latency under guidellm's load profiles: ``core serve`` and ``llama-server`` on one model file.

guidellm (PyPI, pinned) lives in its own venv under the benchmark cache; its synthetic
prompts are counted with the model's own tokenizer (exported once from the GGUF file).
Each server is fresh, warmed by one request, then driven through every profile in turn
(chat completions, streaming). For ``core serve`` the ``/metrics`` TTFT histogram is read
before and after each profile: its mean over the profile's requests sits beside the
client's, so a gap between what the engine measures and what the client waits shows.
Nothing here runs in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import llamacpp
import serve_part

GUIDELLM = "guidellm==0.8.1"
#: name -> guidellm ``--profile``: a constant 1 request/s, 8 and 32 concurrent streams
PROFILES = {
    "rate 1/s": "kind=constant,rate=1",
    "8 streams": "kind=concurrent,streams=8",
    "32 streams": "kind=concurrent,streams=32",
}
TTFT = "core:time_to_first_token_seconds"


def ensure_guidellm() -> Path:
    """The ``guidellm`` executable of the cached venv (created and installed on first use)."""
    venv = llamacpp.cache_dir() / "guidellm-venv"
    exe = venv / "bin" / "guidellm"
    if not exe.exists():
        print(f"installing {GUIDELLM} into {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", GUIDELLM], check=True)
    return exe


def tokenizer_dir(model_path: str) -> Path:
    """A Hugging Face tokenizer folder for ``model_path`` (a GGUF file), exported once."""
    from core.loader.gguf_model import gguf_tokenizer

    folder = llamacpp.cache_dir() / "tokenizers" / Path(model_path).stem
    if not (folder / "tokenizer.json").exists():
        gguf_tokenizer(Path(model_path), None).save_pretrained(folder)
    return folder


def ttft_histogram(base_url: str) -> dict[str, float]:
    """``core serve``'s TTFT histogram: ``sum``, ``count`` and cumulative ``le=<bound>`` counts."""
    import httpx

    found: dict[str, float] = {}
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if not line.startswith(TTFT):
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith(TTFT + "_bucket"):
            found["le=" + name.split('le="', 1)[1].split('"', 1)[0]] = float(value)
        elif name.startswith((TTFT + "_sum", TTFT + "_count")):
            found[name[len(TTFT) + 1 :].split("{", 1)[0]] = float(value)
    return found


def histogram_summary(before: dict[str, float], after: dict[str, float]) -> dict:
    """Mean and bucket-interpolated median (seconds) of the observations between two snapshots."""
    count = after["count"] - before["count"]
    if count <= 0:
        return {"count": 0}
    bounds = sorted((float(k[3:]), after[k] - before.get(k, 0.0)) for k in after if k.startswith("le="))
    median, lower, below = None, 0.0, 0.0
    for bound, cumulative in bounds:
        if cumulative >= count / 2 and median is None:
            share = (count / 2 - below) / (cumulative - below) if cumulative > below else 1.0
            median = lower + share * (bound - lower) if bound != float("inf") else lower
        lower, below = bound, cumulative
    return {"count": count, "mean_s": (after["sum"] - before["sum"]) / count, "p50_s": median}


def run_profile(
    exe: Path, base_url: str, profile: str, seconds: int, tokenizer: Path, prompt: int, output: int
) -> dict:
    """One guidellm profile; the client's figures (ms, tok/s) and its command line."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [
            str(exe), "run", "--backend", f"kind=openai_http,target={base_url}", "--profile", profile,
            "--constraint", f"kind=max_duration,seconds={seconds}",
            "--data", f"kind=synthetic_text,prompt_tokens={prompt},output_tokens={output}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}", "--output", f"kind=json,path={out}",
            "--disable-console",
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode or not out.exists():
            raise RuntimeError(f"guidellm failed ({result.returncode}): {(result.stdout + result.stderr)[-1500:]}")
        (bench,) = json.loads(out.read_text())["benchmarks"]
    m = bench["metrics"]
    # the population /metrics counts: every request that got a first token, finished or cut off at the end
    timings = [r["info"]["timings"] for group in ("successful", "incomplete") for r in bench["requests"][group]]
    ttfts = [t["first_token_iteration"] - t["request_start"] for t in timings if t["first_token_iteration"]]

    def stat(name: str, group: str, key: str) -> float:
        s = m[name][group]
        return s["percentiles"][key] if key.startswith("p") else s[key]

    return {
        "command": " ".join(cmd[1:]).replace(str(out), "run.json").replace(base_url, "http://<server>"),
        "requests": m["request_totals"],
        "ttft_ms": {"p50": stat("time_to_first_token_ms", "successful", "p50"),
                    "p95": stat("time_to_first_token_ms", "successful", "p95"),
                    "mean_first_token_s": sum(ttfts) / len(ttfts) if ttfts else None,
                    "num_first_token": len(ttfts)},
        "itl_ms": {"p50": stat("inter_token_latency_ms", "successful", "p50")},
        "output_tok_s": stat("output_tokens_per_second", "total", "mean"),
        "prompt_tokens": stat("prompt_token_count", "successful", "p50"),
    }  # fmt: skip


def measure(model: str | None, model_path: str, threads: int, seconds: int, prompt: int, output: int) -> dict:
    """Every profile against a fresh ``core serve`` and a fresh ``llama-server`` (``threads`` threads)."""
    exe, tokenizer = ensure_guidellm(), tokenizer_dir(model_path)
    paths = llamacpp.ensure_llamacpp()
    slots = 32
    llama = [str(paths["server"]), "-m", model_path, "--host", "127.0.0.1", "--port", "{port}", "-t", str(threads),
             "-tb", str(threads), "-np", str(slots), "-c", str(slots * (prompt + output + 96))]  # fmt: skip
    servers = {"core serve": serve_part.core_serve_cmd(model, None), "llama-server": llama}
    results: dict = {"guidellm": GUIDELLM, "seconds": seconds, "prompt": prompt, "output": output,
                     "logical_cpus": os.cpu_count(), "load_average_1m": [os.getloadavg()[0]]}  # fmt: skip
    for name, cmd in servers.items():
        results[name] = {"server_command": " ".join(cmd)}
        try:
            with serve_part.server(cmd, name) as base_url:
                run_profile(exe, base_url, "kind=synchronous", 5, tokenizer, prompt, output)  # warm-up
                for label, profile in PROFILES.items():
                    before = ttft_histogram(base_url) if name == "core serve" else None
                    figures = run_profile(exe, base_url, profile, seconds, tokenizer, prompt, output)
                    if before is not None:
                        figures["metrics_ttft"] = histogram_summary(before, ttft_histogram(base_url))
                    results[name][label] = figures
                    results["load_average_1m"].append(os.getloadavg()[0])
                    print(f"{name} {label}: {json.dumps(figures)}", file=sys.stderr, flush=True)
        except RuntimeError as exc:  # a server that dies (llama-server's AMX path, seen) loses its rows only
            results[name]["error"] = str(exc)
            print(f"{name} failed: {exc}", file=sys.stderr, flush=True)
    return results
