"""The kernels the OpenVINO platform hands core's model layers: the SDK's torch defaults,
taking GGUF weights as they are stored so the runner's graph can keep them compressed."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from plugins.int_quant import INT_FORMATS
from plugins.kernels import GGUFWeight, Kernels


class OpenVinoKernels(Kernels):
    """The SDK's reference kernels; GGUF weights are kept in their blocks (the graph reads
    them as OpenVINO compressed weights) and dequantized per call where a layer runs eagerly."""

    def __init__(self, keep_gguf: bool = True) -> None:
        #: with ``keep_gguf`` False core's loader dequantizes GGUF files to dense weights
        self.supported_quantizations = INT_FORMATS | {"gguf"} if keep_gguf else INT_FORMATS

    def prepare_linear(self, weight: torch.Tensor | GGUFWeight, quantization: str | None) -> Any:
        if isinstance(weight, GGUFWeight):
            return weight
        return super().prepare_linear(weight, quantization)

    def linear(self, x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, GGUFWeight):
            return F.linear(x, weight.dequantize().to(x.dtype), bias)
        return super().linear(x, weight, bias)
