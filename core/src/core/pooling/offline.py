"""The offline API's pooling methods (``LLM.embed``, ``LLM.encode``, ``LLM.classify``, ``LLM.score``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from typing import Any

import torch.nn.functional as F
from tqdm.auto import tqdm

from core.pooling.engine import PoolingEngine
from core.pooling.params import PoolingParams, PoolingRequestOutput, ScoringOutput, ScoringRequestOutput

Inputs = str | Seq[str] | Seq[int] | Seq[Seq[int]]


def split_inputs(inputs: Inputs) -> list[tuple[str | None, list[int] | None]]:
    """``(text, None)`` or ``(None, token ids)`` for each input: a string, strings, token ids, or lists of them."""
    if isinstance(inputs, str):
        return [(inputs, None)]
    items = list(inputs)
    if not items:
        raise ValueError("no inputs given")
    if all(isinstance(t, int) for t in items):
        return [(None, list(items))]
    if all(isinstance(t, str) for t in items):
        return [(t, None) for t in items]
    if all(isinstance(t, (list, tuple)) and all(isinstance(i, int) for i in t) for t in items):
        return [(None, list(t)) for t in items]
    raise TypeError("inputs are a string, a list of strings, a list of token ids, or a list of such lists")


class PoolingAPI:
    """The pooling methods of :class:`core.LLM` (its engine must run the pooling runner)."""

    engine: Any
    _ids: itertools.count

    def encode(
        self, inputs: Inputs, pooling_params: PoolingParams | None = None, use_tqdm: bool = True
    ) -> list[PoolingRequestOutput]:
        """Pool every input (text or token ids) as ``pooling_params`` says; outputs in input order."""
        engine = self._pooling_engine()
        params = pooling_params or PoolingParams()
        order = []
        for text, ids in split_inputs(inputs):
            request_id = str(next(self._ids))
            engine.add_request(request_id, prompt=text, params=params, prompt_token_ids=ids)
            order.append(request_id)
        return self._pool(order, use_tqdm)

    def embed(
        self,
        inputs: Inputs,
        use_tqdm: bool = True,
        truncate_prompt_tokens: int | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
    ) -> list[PoolingRequestOutput]:
        """One embedding per input (``outputs.embedding``), normalized as the model's pooler says."""
        params = PoolingParams("embed", normalize, dimensions, truncate_prompt_tokens)
        return self.encode(inputs, params, use_tqdm)

    def classify(self, inputs: Inputs, use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        """Class probabilities per input (``outputs.probs``) from the model's classification head."""
        return self.encode(inputs, PoolingParams("classify"), use_tqdm)

    def score(
        self, data_1: str | Seq[str], data_2: str | Seq[str], use_tqdm: bool = True
    ) -> list[ScoringRequestOutput]:
        """Scores of ``data_1`` against each of ``data_2`` (one text against N) or pairwise (N against N):
        a cross-encoder's (sigmoid of its one-label head on each pair), else the cosine of the embeddings."""
        first = [data_1] if isinstance(data_1, str) else list(data_1)
        second = [data_2] if isinstance(data_2, str) else list(data_2)
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second) or not second:
            raise ValueError(f"score() pairs 1 text with N or N with N; got {len(first)} and {len(second)}")
        engine = self._pooling_engine()
        if engine.is_cross_encoder:
            pairs = [engine.tokenize_pair(a, b) for a, b in zip(first, second, strict=True)]
            outs = self.encode(pairs, PoolingParams("score"), use_tqdm)
            return [
                ScoringRequestOutput(o.request_id, o.prompt_token_ids, ScoringOutput(float(o.outputs.data[0])))
                for o in outs
            ]
        outs = self.embed([*first, *second], use_tqdm=use_tqdm, normalize=True)
        left, right = outs[: len(first)], outs[len(first) :]
        return [
            ScoringRequestOutput(
                f"{a.request_id}-{b.request_id}",
                a.prompt_token_ids + b.prompt_token_ids,
                ScoringOutput(float(F.cosine_similarity(a.outputs.data, b.outputs.data, dim=0))),
            )
            for a, b in zip(left, right, strict=True)
        ]

    def _pooling_engine(self) -> PoolingEngine:
        if not isinstance(self.engine, PoolingEngine):
            raise ValueError(
                f"this LLM runs {self.engine.loaded.name} with the generate runner; pooling needs LLM(..., runner='pooling')"
            )
        return self.engine

    def _pool(self, order: list[str], use_tqdm: bool) -> list[PoolingRequestOutput]:
        finished: dict[str, PoolingRequestOutput] = {}
        with tqdm(total=len(order), desc="Processed inputs", disable=not use_tqdm, unit="input") as bar:
            while self.engine.has_unfinished_requests():
                outputs = self.engine.step()
                finished.update((out.request_id, out) for out in outputs)
                bar.update(len(outputs))
        return [finished[request_id] for request_id in order]
