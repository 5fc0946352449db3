"""Embeddings per second: all-MiniLM-L6-v2 through core's offline API (``LLM.embed``) against
sentence-transformers on the same CPU threads, 1,000 sentences of mixed length, in one invocation.

    python bench/pooling_vs_sentence_transformers.py [--threads N] [--rounds 5] [--device auto]
        [--quantization bf16] [--server] [--llama-server]

Both see the same sentences in the same order; each side runs ``--rounds`` timed passes after a
warm-up, alternating (so a change in the machine's load hits both); each round's ratio is core's
rate over sentence-transformers' in that round, and the median of those ratios is the figure (the
best pass of each side is printed too, with the load average at each round).
sentence-transformers runs with ``torch.set_num_threads(N)`` at its default batch size (32,
sorted by length) in float32; core runs with its platform's own threading on the same N CPUs,
in ``--dtype`` with ``--quantization`` (``bf16``: weights rounded to bfloat16 at load, products
summed in float32, the rest in float32). It prints
the CPU (``lscpu``), the embeddings/s of each, their ratio and the lowest cosine between them.
With ``--server`` it also times ``core serve``'s ``/v1/embeddings`` and with ``--llama-server``
llama.cpp's (the folder converted by llama.cpp's convert_hf_to_gguf.py to a float32 GGUF; the
build of bench/llamacpp.py), both after the offline passes, on the same CPUs: requests of 32
sentences, 4 at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

WORDS = (
    "the of and to in is that for it as with was on be by at this from or an are not have but which one all "
    "were when we there can been has more if no out so what up its into than them only other new some could "
    "time these two may first then do any like my now over such our man me even most made after also did many "
    "before must through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life being under "
    "never day same another know while last might us great old year off come since against go came right used "
    "take three retrieval embedding vector model server batch token attention encoder query document rank"
).split()


def sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` sentences: half short (3-12 words), a third medium (12-40), a sixth long (40-150)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        kind = rng.random()
        n = rng.randint(3, 12) if kind < 0.5 else rng.randint(12, 40) if kind < 5 / 6 else rng.randint(40, 150)
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
    return out


def cpu_description() -> str:
    """``lscpu``'s model name and the vector ISA flags that matter here."""
    info = dict(
        line.split(":", 1) for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    )
    flags = info.get("Flags", "").split()
    isa = [f for f in flags if f.startswith(("avx", "amx", "fma", "neon", "asimd", "sve"))]
    return f"{info.get('Model name', '?').strip()}; ISA: {' '.join(isa)}"


def server_rate(cmd: list[str], ready: str, texts: list[str], rounds: int) -> tuple[float, torch.Tensor]:
    """Embeddings/s of a server's /v1/embeddings (started with ``cmd``, ready once its log matches
    ``ready``, whose group is its URL): requests of 32 texts, 4 in flight, best of ``rounds``; and
    the embeddings of the last pass."""
    import httpx

    env = {**os.environ, "TQDM_DISABLE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for line in proc.stdout:
            if match := re.search(ready, line):
                url = match.group(1)
                break
        else:
            raise RuntimeError(f"{cmd[0]} did not start")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its log from filling the pipe
        chunks = [texts[i : i + 32] for i in range(0, len(texts), 32)]
        with httpx.Client(base_url=url, timeout=600) as http, concurrent.futures.ThreadPoolExecutor(4) as pool:

            def post(chunk: list[str]) -> list[list[float]]:
                response = http.post("/v1/embeddings", json={"input": chunk})
                response.raise_for_status()
                return [item["embedding"] for item in sorted(response.json()["data"], key=lambda d: d["index"])]

            list(pool.map(post, chunks[:2]))
            best = float("inf")
            for _ in range(rounds):
                start = time.perf_counter()
                vectors = [v for part in pool.map(post, chunks) for v in part]
                best = min(best, time.perf_counter() - start)
        return len(texts) / best, torch.tensor(vectors)
    finally:
        proc.terminate()
        proc.wait(30)


def core_serve_cmd(path: str, device: str, dtype: str, quantization: str | None) -> list[str]:
    serve = [sys.executable, "-m", "core.cli", "serve", path, "--device", device, "--dtype", dtype]
    quant = [] if quantization is None else ["--quantization", quantization]
    return [*serve, *quant, "--port", "0", "--host", "127.0.0.1"]


def llama_server_cmd(path: str, threads: int) -> list[str]:
    """llama-server (the cached build of bench/llamacpp.py) with ``--embedding`` on the folder
    converted to a float32 GGUF by llama.cpp's own convert_hf_to_gguf.py."""
    sys.path.insert(0, str(Path(__file__).parent))
    import llamacpp

    server = llamacpp.ensure_llamacpp()["server"]
    (convert,) = llamacpp.cache_dir().glob("src/*/vendor/llama.cpp/convert_hf_to_gguf.py")
    gguf = Path(path).parent / "minilm-f32.gguf"
    subprocess.run(
        [sys.executable, str(convert), path, "--outfile", str(gguf), "--outtype", "f32"],
        check=True,
        capture_output=True,
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # 32 slots of 512 tokens: a request's 32 inputs share one batch
    sizes = ["-c", "16384", "--parallel", "32", "-b", "4096", "-ub", "4096"]
    return [str(server), "-m", str(gguf), "--embedding", "-t", str(threads), *sizes, "--port", str(port)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32", help="core's compute dtype (sentence-transformers: float32)")
    parser.add_argument("--quantization", default=None, help="core's --quantization (e.g. bf16)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--server", action="store_true", help="also time core serve's /v1/embeddings")
    parser.add_argument("--llama-server", action="store_true", help="also time llama.cpp's llama-server --embedding")
    args = parser.parse_args()

    import all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from core import LLM

    path = str(all_minilm_l6_v2.extract_model(tempfile.mkdtemp(prefix="minilm-")))
    texts = sentences(args.count)
    cpus = sorted(os.sched_getaffinity(0))[: args.threads]
    os.sched_setaffinity(0, cpus)
    os.environ.setdefault("CORE_CPU_OMP_THREADS_BIND", f"{cpus[0]}-{cpus[-1]}")

    st = SentenceTransformer(path, device="cpu")
    extra = {} if args.max_num_batched_tokens is None else {"max_num_batched_tokens": args.max_num_batched_tokens}
    llm = LLM(path, device=args.device, dtype=args.dtype, quantization=args.quantization, **extra)
    core_threads = torch.get_num_threads()  # as the platform set it for its engine thread

    def run_st() -> tuple[float, torch.Tensor]:
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(args.threads)
        start = time.perf_counter()
        vectors = st.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_tensor=True)
        return time.perf_counter() - start, vectors

    def run_core() -> tuple[float, torch.Tensor]:
        torch.set_num_threads(core_threads)
        start = time.perf_counter()
        outs = llm.embed(texts, use_tqdm=False)
        return time.perf_counter() - start, torch.stack([o.outputs.data for o in outs])

    st.encode(texts[:64], batch_size=32)
    llm.embed(texts[:64], use_tqdm=False)
    times: dict[str, list[float]] = {"sentence-transformers": [], "core": []}
    loads = []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        seconds, ref = run_st()
        times["sentence-transformers"].append(seconds)
        seconds, ours = run_core()
        times["core"].append(seconds)
    tokens = sum(len(t) for t in llm.get_tokenizer()(texts)["input_ids"])
    print(f"CPU: {cpu_description()}")
    print(f"torch {torch.__version__}; {args.threads} threads (CPUs {cpus}); core on {llm.engine.platform.name} "
          f"in {llm.engine.config.dtype} (quantization {args.quantization}), "
          f"max_num_batched_tokens={llm.engine.config.max_num_batched_tokens}")  # fmt: skip
    print(f"{len(texts)} sentences, {tokens} tokens (mean {tokens / len(texts):.1f})")
    rates = {}
    for name, runs in times.items():
        rates[name] = len(texts) / min(runs)
        print(f"{name:>22}: {rates[name]:7.1f} embeddings/s (best of {', '.join(f'{s:.2f}' for s in runs)} s)")
    ratios = [st_s / core_s for st_s, core_s in zip(times["sentence-transformers"], times["core"], strict=True)]
    print(f"core / sentence-transformers per round: {', '.join(f'{r:.2f}' for r in ratios)} "
          f"(1-min load average at each round's start: {', '.join(f'{x:.1f}' for x in loads)})")  # fmt: skip
    print(f"core / sentence-transformers: {statistics.median(ratios):.2f}x median of rounds "
          f"({rates['core'] / rates['sentence-transformers']:.2f}x best vs best)")  # fmt: skip
    print(f"lowest cosine between them: {float((ours * ref.float()).sum(-1).min()):.6f}")
    llm.shutdown()
    servers = {
        "core serve": (
            args.server,
            lambda: core_serve_cmd(path, args.device, args.dtype, args.quantization),
            r"ready: serving on (http://\S+)",
        ),
        "llama-server": (args.llama_server, lambda: llama_server_cmd(path, args.threads), r"listening on (http://\S+)"),
    }
    for name, (wanted, cmd, ready) in servers.items():
        if wanted:
            rate, vectors = server_rate(cmd(), ready, texts, args.rounds)
            cosine = float((vectors * ref.float()).sum(-1).min())
            print(f"{name + ' /v1/embeddings':>30}: {rate:7.1f} embeddings/s "
                  f"({rate / rates['sentence-transformers']:.2f}x sentence-transformers; lowest cosine {cosine:.6f})")  # fmt: skip


if __name__ == "__main__":
    main()
