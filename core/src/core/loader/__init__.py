"""Model loading: Hugging Face directories, GGUF files, hub ids and the default model."""

from core.loader.loader import LoadedModel, load_model
from core.loader.source import default_model_path, resolve_model

__all__ = ["LoadedModel", "default_model_path", "load_model", "resolve_model"]
