"""Without an Intel GPU the shared Triton kernels run under Triton's interpreter on CPU
tensors; it must be switched on before ``triton`` is first imported, hence here."""

import os

import torch

if not torch.xpu.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
