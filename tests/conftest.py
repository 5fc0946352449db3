"""Shared fixtures of the end-to-end tests: a tiny random-weight Llama and a real ``core serve`` process."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

READY = re.compile(r"ready: serving on (http://\S+)")
TINY_LLAMA_VERSION = 1  # bump when _build_tiny_llama changes


def _build_tiny_llama(directory: Path) -> None:
    """A 2-layer Llama with random weights and SmolLM2's real tokenizer (and chat template)."""
    import torch
    from core.loader import default_model_path
    from core.loader.gguf_model import gguf_tokenizer
    from plugins.reference import tiny_model_config
    from transformers import LlamaForCausalLM

    tokenizer = gguf_tokenizer(default_model_path(), None)  # converted once, then cached by the loader
    config = tiny_model_config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger than the default init so greedy outputs vary from token to token
        for param in model.parameters():
            param.normal_(0, 0.5 if param.dim() > 1 else 0.02).add_(1.0 if param.dim() == 1 else 0.0)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)


@pytest.fixture(scope="session")
def tiny_llama() -> Path:
    """Directory of a tiny random Llama (vocabulary and chat template of SmolLM2), built once and cached."""
    from core.loader.cache import cache_root

    directory = cache_root() / "test-models" / f"tiny-llama-{TINY_LLAMA_VERSION}"
    if not (directory / "model.safetensors").exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".tmp-"))
        _build_tiny_llama(tmp)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    return directory


class ServerProcess:
    """``python -m core.cli serve`` on a free port; ``url`` once it logged that it is ready."""

    def __init__(self, model: Path, *flags: str, timeout: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "core.cli", "serve", str(model), "--host", "127.0.0.1", "--port", "0", *flags]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        found = threading.Event()
        self.url = ""

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                match = READY.search(line)
                if match and not found.is_set():
                    self.url = match.group(1)
                    found.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("core serve did not start:\n" + "".join(self.lines[-60:]))

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal the server and wait for it; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode


@pytest.fixture(scope="session")
def start_server() -> type[ServerProcess]:
    """``start_server(model_dir, *flags)`` starts ``core serve`` and returns its :class:`ServerProcess`."""
    return ServerProcess


@pytest.fixture(scope="module")
def http(server):
    """An httpx client of the module's ``server`` fixture (a :class:`ServerProcess`), without a key."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client
