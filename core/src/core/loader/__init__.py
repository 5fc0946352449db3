"""Model loading: Hugging Face directories, GGUF files, hub ids and the default model."""

from core.loader.loader import LoadedModel, ModelSource, load_model, open_model
from core.loader.source import default_model_path, resolve_model

__all__ = ["LoadedModel", "ModelSource", "default_model_path", "load_model", "open_model", "resolve_model"]
