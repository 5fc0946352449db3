"""Physical limits of this machine and this model: memory bandwidth, matmul rate, model sizes."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path


def _best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(threads: int, mib: int = 512, repeats: int = 10) -> float:
    """Bytes/s of a large float32 copy (read + write counted), best of ``repeats``."""
    import torch

    torch.set_num_threads(threads)
    src = torch.ones(mib * (1 << 20) // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_time(lambda: dst.copy_(src), repeats)


def matmul_rate(threads: int, n: int = 1024, repeats: int = 30) -> float:
    """FLOP/s of an ``n`` x ``n`` float32 matmul (2 n^3 FLOPs), best of ``repeats``."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return 2 * n**3 / _best_time(lambda: torch.mm(a, b, out=out), repeats)


@dataclass
class ModelShape:
    """What the floors need from a GGUF: bytes and matmul parameters."""

    file_bytes: int  # tensor bytes as stored (what a quantized decode step streams)
    params: int  # every weight element
    embed_params: int  # the token embedding (also the lm_head when tied)
    tied: bool  # no separate output.weight: lm_head reads token_embd
    num_layers: int
    attn_width: int  # num_heads * head_dim
    kv_width: int  # num_kv_heads * head_dim

    @property
    def lm_head_params(self) -> int:
        return self.embed_params

    def matmul_params(self, with_lm_head: bool) -> int:
        """Weight elements one token multiplies (the embedding lookup is not a matmul)."""
        body = self.params - self.embed_params - (0 if self.tied else self.lm_head_params)
        return body + (self.lm_head_params if with_lm_head else 0)


def read_gguf_shape(path: str | Path) -> ModelShape:
    """Sizes of a GGUF's tensors and the attention width from its metadata."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    names = {t.name: t for t in reader.tensors}
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()

    def meta(key: str) -> int:
        return int(reader.fields[f"{arch}.{key}"].parts[-1][0])

    embed = names["token_embd.weight"]
    return ModelShape(
        file_bytes=sum(int(t.n_bytes) for t in reader.tensors),
        params=sum(int(t.n_elements) for t in reader.tensors if len(t.shape) > 1),
        embed_params=int(embed.n_elements),
        tied="output.weight" not in names,
        num_layers=meta("block_count"),
        attn_width=meta("embedding_length"),
        kv_width=meta("embedding_length") * meta("attention.head_count_kv") // meta("attention.head_count"),
    )


def workload_flops(shape: ModelShape, num_seqs: int, prompt_len: int, gen_len: int) -> float:
    """Matmul + attention FLOPs of ``num_seqs`` x (prefill ``prompt_len``, decode ``gen_len``).

    Prompt tokens skip the lm_head except the last; every token attends over its context
    (QK^T and PV: 4 * context * attn_width FLOPs per layer).
    """
    body, full = 2 * shape.matmul_params(False), 2 * shape.matmul_params(True)
    per_seq = prompt_len * body + gen_len * full
    total_ctx = sum(range(1, prompt_len + gen_len + 1))
    per_seq += 4 * total_ctx * shape.attn_width * shape.num_layers
    return float(num_seqs * per_seq)


def workload_kv_bytes(shape: ModelShape, num_seqs: int, prompt_len: int, gen_len: int, itemsize: int = 4) -> float:
    """Bytes of K/V cache the decode steps of ``num_seqs`` x (``prompt_len`` + ``gen_len``) read.

    A token decoded at context c reads c K and c V rows of ``kv_width`` values a layer; with
    nothing to share them between sequences, each is read once a step (prefill tokens read
    theirs a few query tokens at a time and are left out).
    """
    contexts = sum(range(prompt_len + 1, prompt_len + gen_len + 1))
    return float(num_seqs * 2 * contexts * shape.kv_width * itemsize * shape.num_layers)


def machine_info() -> dict[str, str]:
    """CPU model, the SIMD flags that matter, core count."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "avx_vnni")
    return {
        "cpu": model,
        "flags": " ".join(f for f in wanted if f in flags),
        "logical_cpus": str(os.cpu_count()),
        "python": platform.python_version(),
        "load_average_1m": f"{os.getloadavg()[0]:.2f}",
    }
