"""Which model class runs which Hugging Face architecture name."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch
from plugins.kernels import Kernels

from core.models.bert import BertForSequenceClassification, BertModel
from core.models.gemma3 import Gemma3ForCausalLM
from core.models.llama import LlamaForCausalLM
from core.models.mistral import MistralForCausalLM
from core.models.mixtral import MixtralForCausalLM
from core.models.phi3 import Phi3ForCausalLM
from core.models.qwen2 import Qwen2ForCausalLM
from core.models.qwen3 import Qwen3ForCausalLM, Qwen3MoeForCausalLM
from core.partition.pipeline import PipelineStage

MODEL_REGISTRY: MappingProxyType[str, type[LlamaForCausalLM | BertModel]] = MappingProxyType(
    {
        "BertForSequenceClassification": BertForSequenceClassification,
        "BertModel": BertModel,
        "Gemma3ForCausalLM": Gemma3ForCausalLM,
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": MistralForCausalLM,
        "MixtralForCausalLM": MixtralForCausalLM,
        "Phi3ForCausalLM": Phi3ForCausalLM,
        "Qwen2ForCausalLM": Qwen2ForCausalLM,
        "Qwen3ForCausalLM": Qwen3ForCausalLM,
        "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    }
)


def get_model_class(architectures: list[str] | None) -> type[LlamaForCausalLM | BertModel]:
    """The class for the first supported name in a config's ``architectures``.

    :raises ValueError: naming the architectures asked for and listing the supported ones.
    """
    for name in architectures or []:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(
        f"unsupported model architecture {architectures!r}; supported: {', '.join(sorted(MODEL_REGISTRY))}"
    )


def build_model(
    config: Any,
    kernels: Kernels,
    dtype: torch.dtype,
    device: torch.device,
    comm: Any | None = None,
    stage: PipelineStage | None = None,
) -> LlamaForCausalLM | BertModel:
    """An empty (weightless) model for ``config``; fill it with ``model.load_weights(...)``.

    With a communicator ``comm``, the model is that rank's tensor-parallel shard; with a
    pipeline ``stage``, that stage's layers (decoders only).
    """
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"unsupported model dtype {dtype}; supported: float32, bfloat16, float16")
    model_class = get_model_class(getattr(config, "architectures", None))
    if stage is None:
        return model_class(config, kernels, dtype, device, comm)
    if not issubclass(model_class, LlamaForCausalLM):
        raise ValueError(f"{model_class.__name__} cannot be split into pipeline stages")
    return model_class(config, kernels, dtype, device, comm, stage)
