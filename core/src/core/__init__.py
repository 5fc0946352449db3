"""core: a device-neutral LLM inference and serving engine with pluggable backends.

``from core import LLM, SamplingParams`` is the offline API; ``core serve`` the server.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["LLM", "LoRARequest", "PoolingParams", "SamplingParams", "StructuredOutputsParams", "__version__"]

if TYPE_CHECKING:
    from core.llm import LLM
    from core.lora import LoRARequest
    from core.pooling import PoolingParams
    from core.sampling_params import SamplingParams
    from core.structured import StructuredOutputsParams


def __getattr__(name: str):
    # lazy: `core devices` must not pay for importing torch and transformers
    if name == "LLM":
        from core.llm import LLM

        return LLM
    if name == "LoRARequest":
        from core.lora import LoRARequest

        return LoRARequest
    if name == "PoolingParams":
        from core.pooling import PoolingParams

        return PoolingParams
    if name == "SamplingParams":
        from core.sampling_params import SamplingParams

        return SamplingParams
    if name == "StructuredOutputsParams":
        from core.structured import StructuredOutputsParams

        return StructuredOutputsParams
    raise AttributeError(f"module 'core' has no attribute {name!r}")
