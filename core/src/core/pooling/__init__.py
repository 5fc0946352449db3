"""Pooling models (``--runner pooling``): embeddings, scores and classification.

The feature's parts: :mod:`~core.pooling.params` (what a request asks, what it gets),
:mod:`~core.pooling.config` (how a checkpoint pools: sentence-transformers' modules),
:mod:`~core.pooling.inputs` (texts and pairs to token ids, truncated as the tokenizer would),
:mod:`~core.pooling.pooler` (hidden states to vectors), :mod:`~core.pooling.runner` (a step on
the device: encoders through ``Kernels.encoder_attention``, decoders over a scratch KV cache),
:mod:`~core.pooling.engine` (the prefill-only engine) and :mod:`~core.pooling.select` (which
engine a checkpoint gets). Callers use :func:`make_engine` for either runner.
"""

from core.pooling.engine import PoolingEngine
from core.pooling.params import PoolingOutput, PoolingParams, PoolingRequestOutput, ScoringOutput, ScoringRequestOutput
from core.pooling.select import choose_runner, make_engine

__all__ = [
    "PoolingEngine",
    "PoolingOutput",
    "PoolingParams",
    "PoolingRequestOutput",
    "ScoringOutput",
    "ScoringRequestOutput",
    "choose_runner",
    "make_engine",
]
