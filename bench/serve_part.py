"""``core serve`` with N concurrent streams: start a server, drive it, stop it."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"core serve exited with code {proc.returncode} before becoming healthy")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"core serve not healthy after {timeout_s:.0f}s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server, SIGKILL it after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(
    model: str | None, quantization: str | None, num_seqs: int, prompt_len: int, n_gen: int, vocab: int, seed: int
) -> dict:
    """Generated tok/s and TTFT/ITL of ``num_seqs`` concurrent streams against a fresh ``core serve``."""
    from core.bench.serve import run_level
    from core.bench.stats import random_prompts

    port = _free_port()
    cmd = [sys.executable, "-m", "core.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    cmd += [model] if model else []
    cmd += ["--quantization", quantization] if quantization else []
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would stall the server
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base_url, proc, timeout_s=600)
        asyncio.run(run_level(base_url, None, random_prompts(1, 8, vocab, seed + 1), 2, 1, timeout_s=120))  # warm-up
        prompts = random_prompts(num_seqs, prompt_len, vocab, seed)
        level = asyncio.run(run_level(base_url, None, prompts, n_gen, num_seqs, timeout_s=120))
    finally:
        stop(proc)
        log.seek(0)
        err = log.read()
    if level.num_failed:
        raise RuntimeError(
            f"{level.num_failed} of {level.num_requests} requests failed: {level.errors}; server log: {err[-1500:]}"
        )
    return {"quantization": quantization, "output_tok_s": level.output_tok_s, "level": level.__dict__}
