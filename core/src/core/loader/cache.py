"""Where the loader keeps what is slow to rebuild (converted GGUF tokenizers, GGUF indexes)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """``$CORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/core``, else ``~/.cache/core``."""
    if explicit := os.environ.get("CORE_CACHE_DIR"):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "core"


def file_key(path: Path) -> str:
    """A key that changes when the file is replaced: its absolute path, size and mtime."""
    stat = path.stat()
    ident = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:24]
