"""Model definitions built from shared layers whose hot ops call a platform's kernels."""

from core.models.gemma3 import Gemma3ForCausalLM
from core.models.llama import LlamaForCausalLM
from core.models.mistral import MistralForCausalLM
from core.models.mixtral import MixtralForCausalLM
from core.models.phi3 import Phi3ForCausalLM
from core.models.qwen2 import Qwen2ForCausalLM
from core.models.qwen3 import Qwen3ForCausalLM, Qwen3MoeForCausalLM
from core.models.registry import MODEL_REGISTRY, build_model, get_model_class

__all__ = [
    "MODEL_REGISTRY",
    "Gemma3ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Phi3ForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "build_model",
    "get_model_class",
]
