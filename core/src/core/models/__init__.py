"""Model definitions built from shared layers whose hot ops call a platform's kernels."""

from core.models.gemma3 import Gemma3ForCausalLM
from core.models.llama import LlamaForCausalLM
from core.models.mistral import MistralForCausalLM
from core.models.qwen2 import Qwen2ForCausalLM
from core.models.registry import MODEL_REGISTRY, build_model, get_model_class

__all__ = [
    "MODEL_REGISTRY",
    "Gemma3ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "build_model",
    "get_model_class",
]
