"""Servers under benchmark: start one on a free port, drive it, stop it; ``core serve`` with N concurrent streams."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, name: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} before becoming healthy")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{name} not healthy after {timeout_s:.0f}s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server, SIGKILL it after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def server(cmd: list[str], name: str, health_path: str = "/health", env: dict | None = None) -> Iterator[str]:
    """Run the server ``cmd`` (a ``{port}`` in it becomes a free port) until the block ends; yields its base URL.

    :raises RuntimeError: when it exits or is not healthy within 10 minutes (its log's tail in the message).
    """
    port = _free_port()
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would stall the server
    proc = subprocess.Popen(
        [part.format(port=port) for part in cmd], stdout=log, stderr=subprocess.STDOUT, text=True, env=env
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base_url + health_path, proc, name, timeout_s=600)
        yield base_url
    except Exception as exc:
        log.seek(0)
        raise RuntimeError(f"{name}: {exc}; its log: {log.read()[-1500:]}") from exc
    finally:
        stop(proc)


def core_serve_cmd(model: str | None, quantization: str | None) -> list[str]:
    """``core serve`` on ``127.0.0.1:{port}`` in float32 (the engine's default path)."""
    cmd = [sys.executable, "-m", "core.cli", "serve", "--host", "127.0.0.1", "--port", "{port}", "--dtype", "float32"]
    cmd += [model] if model else []
    return cmd + (["--quantization", quantization] if quantization else [])


def measure(
    model: str | None, quantization: str | None, num_seqs: int, prompt_len: int, n_gen: int, vocab: int, seed: int
) -> dict:
    """Generated tok/s and TTFT/ITL of ``num_seqs`` concurrent streams against a fresh ``core serve``."""
    from core.bench.serve import run_level
    from core.bench.stats import random_prompts

    with server(core_serve_cmd(model, quantization), "core serve") as base_url:
        asyncio.run(run_level(base_url, None, random_prompts(1, 8, vocab, seed + 1), 2, 1, timeout_s=120))  # warm-up
        prompts = random_prompts(num_seqs, prompt_len, vocab, seed)
        level = asyncio.run(run_level(base_url, None, prompts, n_gen, num_seqs, timeout_s=120))
    if level.num_failed:
        raise RuntimeError(f"{level.num_failed} of {level.num_requests} requests failed: {level.errors}")
    return {"quantization": quantization, "output_tok_s": level.output_tok_s, "level": level.__dict__}
