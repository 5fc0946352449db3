"""The pooling endpoints: ``/v1/embeddings``, ``/pooling``, ``/classify``, ``/score`` (``/v1/``),
``/rerank`` (``/v1/``, ``/v2/``). Each input is one request of the pooling engine
(:class:`core.pooling.PoolingEngine`); a server that runs the generate runner answers them with a
400 naming it. Scores and rerank relevance are a cross-encoder's (a one-label classification head on
the pair), else the cosine of the two texts' normalized embeddings."""

from __future__ import annotations

import asyncio
import base64
import functools
import time
from typing import Any

import torch
from fastapi import FastAPI, Request

from core.async_engine import EngineDeadError
from core.pooling import PoolingEngine, PoolingParams, PoolingRequestOutput
from core.pooling.pooler import check_dimensions
from core.server.errors import APIError, bad_request
from core.server.frontend import Frontend
from core.server.middleware import arrival_time
from core.server.pooling_protocol import (
    ClassificationRequest,
    EmbeddingRequest,
    Input,
    PoolingFields,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from core.server.streaming import collect, until_disconnected


class PoolingServer:
    """Validates pooling requests, runs each input as an engine request, and shapes the answers."""

    def __init__(self, fe: Frontend) -> None:
        self.fe = fe

    @property
    def engine(self) -> PoolingEngine:
        """The pooling engine (the same model and limits in every replica); 400 for a generate server."""
        engine = self.fe.engine.engine
        if not isinstance(engine, PoolingEngine):
            raise bad_request(
                f"model {self.fe.model_name} runs with the generate runner: this endpoint needs a pooling model "
                "(core serve MODEL --runner pooling)",
                "model",
            )
        return engine

    async def token_ids(self, value: Input, truncate: int | None, param: str = "input") -> list[list[int]]:
        """Each input's token ids, truncated as asked; 400 naming ``param`` when one is empty, too long or out of the vocabulary."""
        engine, fe = self.engine, self.fe
        texts = [value] if isinstance(value, str) else list(value)
        if not texts:
            raise bad_request(f"{param} must not be empty", param)
        if isinstance(texts[0], int):
            texts = [texts]
        fe.check_queue_fits(len(texts))
        keep = engine.config.max_model_len if truncate == -1 else truncate
        if isinstance(texts[0], str):
            encode = functools.partial(engine.tokenize, max_tokens=keep)
            encoded = await asyncio.get_running_loop().run_in_executor(None, lambda: [encode(t) for t in texts])
        else:
            encoded = [list(ids)[-keep:] if keep else list(ids) for ids in texts]
            for ids in encoded:
                fe.check_token_ids(ids, param)
        return [self.checked(ids, param) for ids in encoded]

    async def pair_ids(self, first: list[str], second: list[str], truncate: int | None) -> list[list[int]]:
        """A cross-encoder's input of each pair (``[CLS] first [SEP] second [SEP]``), truncated as asked."""
        engine = self.engine
        self.fe.check_queue_fits(len(first))
        keep = engine.config.max_model_len if truncate == -1 else truncate
        encode = functools.partial(engine.tokenize_pair, max_tokens=keep)
        pairs = list(zip(first, second, strict=True))
        encoded = await asyncio.get_running_loop().run_in_executor(None, lambda: [encode(a, b) for a, b in pairs])
        return [self.checked(ids, "text_2") for ids in encoded]

    def checked(self, ids: list[int], param: str) -> list[int]:
        """``ids``, or a 400 naming ``param`` when they are empty or longer than the model takes."""
        limit = self.engine.config.max_model_len
        if not ids:
            raise bad_request(f"{param} holds an empty input: each needs at least one token", param)
        if len(ids) > limit:
            raise bad_request(
                f"{param} holds an input of {len(ids)} tokens; this model takes at most {limit}: "
                "shorten it or set truncate_prompt_tokens",
                param,
            )
        return ids

    async def run(self, raw: Request, prompts: list[list[int]], params: PoolingParams) -> list[PoolingRequestOutput]:
        """Admit one engine request per prompt and wait for all of them (they are aborted if the client leaves).

        The requests are handed to the engines at once: each engine takes them in at its next step boundary.
        """
        fe = self.fe
        tickets = fe.admit(len(prompts))
        replicas = []
        for _ in prompts:
            replica = min(range(len(fe.replicas)), key=fe.in_flight.__getitem__)
            fe.in_flight[replica] += 1
            replicas.append(replica)
        arrival = arrival_time(raw.scope)
        adds = [
            fe.replicas[replica].add_request(fe.new_id("pool"), params, prompt_token_ids=ids, arrival_time=arrival)
            for replica, ids in zip(replicas, prompts, strict=True)
        ]
        streams = await asyncio.gather(*adds, return_exceptions=True)
        try:
            failed = next((s for s in streams if isinstance(s, BaseException)), None)
            if failed is not None:
                raise failed
            finals = await until_disconnected(raw, asyncio.gather(*(collect(s) for s in streams)))
        except EngineDeadError as exc:
            raise APIError(503, f"the engine is not running: {exc}") from exc
        finally:
            for ticket in tickets:
                ticket.release()
            for replica in replicas:
                fe.in_flight[replica] -= 1
            for stream in streams:
                if not isinstance(stream, BaseException):
                    stream.close()
        if any(out.is_aborted for out in finals):
            raise APIError(503, "the request was aborted: the server is shutting down")
        metrics = fe.metrics
        for out in finals:
            metrics.prompt_tokens.inc(len(out.prompt_token_ids))
            metrics.request_success("stop")
            metrics.e2e.observe(time.time() - arrival_time(raw.scope))
        return finals

    def params(self, req: PoolingFields, **fields: Any) -> PoolingParams:
        params = PoolingParams(truncate_prompt_tokens=req.truncate_prompt_tokens, **fields)
        try:
            check_dimensions(params, self.engine.pooler, self.engine.hidden_size)
        except ValueError as exc:
            raise bad_request(str(exc), "dimensions") from None
        return params

    def envelope(self, prefix: str, data: list[dict[str, Any]], outs: list[PoolingRequestOutput]) -> dict[str, Any]:
        return {
            "id": self.fe.new_id(prefix),
            "object": "list",
            "created": int(time.time()),
            "model": self.fe.model_name,
            "data": data,
            "usage": usage(outs),
        }

    async def vectors(self, raw: Request, req: EmbeddingRequest | PoolingRequest, kind: str) -> dict[str, Any]:
        params = self.params(req, dimensions=req.dimensions, normalize=req.normalize)
        outs = await self.run(raw, await self.token_ids(req.input, req.truncate_prompt_tokens), params)
        field = "embedding" if kind == "embedding" else "data"
        data = [
            {"index": i, "object": kind, field: encode(out.outputs.data, req.encoding_format)}
            for i, out in enumerate(outs)
        ]
        return self.envelope("embd" if kind == "embedding" else "pool", data, outs)

    async def classify(self, raw: Request, req: ClassificationRequest) -> dict[str, Any]:
        if not self.engine.can_classify:
            raise bad_request(f"model {self.fe.model_name} has no classification head", "model")
        outs = await self.run(
            raw, await self.token_ids(req.input, req.truncate_prompt_tokens), self.params(req, task="classify")
        )
        labels = self.engine.loaded.hf_config.id2label
        data = []
        for i, out in enumerate(outs):
            probs = out.outputs.probs
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append({"index": i, "label": labels.get(best, str(best)), "probs": probs, "num_classes": len(probs)})
        return self.envelope("classify", data, outs)

    async def similarities(
        self, raw: Request, req: PoolingFields, first: list[str], second: list[str]
    ) -> tuple[list[float], list[PoolingRequestOutput]]:
        """The score of each pair ``first[i]``, ``second[i]``: a cross-encoder's, else the cosine of
        their embeddings (one per distinct text)."""
        if self.engine.is_cross_encoder:
            prompts = await self.pair_ids(first, second, req.truncate_prompt_tokens)
            outs = await self.run(raw, prompts, PoolingParams("score"))
            return [float(out.outputs.data[0]) for out in outs], outs
        texts = list(dict.fromkeys([*first, *second]))
        outs = await self.run(
            raw, await self.token_ids(texts, req.truncate_prompt_tokens), self.params(req, normalize=True)
        )
        vectors = dict(zip(texts, (o.outputs.data for o in outs), strict=True))
        scores = [float(torch.dot(vectors[a], vectors[b])) for a, b in zip(first, second, strict=True)]
        return scores, outs

    async def score(self, raw: Request, req: ScoreRequest) -> dict[str, Any]:
        first = [req.text_1] if isinstance(req.text_1, str) else req.text_1
        second = [req.text_2] if isinstance(req.text_2, str) else req.text_2
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise bad_request(
                f"text_1 has {len(first)} texts and text_2 {len(second)}: send 1 and N, or N and N", "text_1"
            )
        scores, outs = await self.similarities(raw, req, first, second)
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return self.envelope("score", data, outs)

    async def rerank(self, raw: Request, req: RerankRequest) -> dict[str, Any]:
        scores, outs = await self.similarities(raw, req, [req.query] * len(req.documents), req.documents)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.top_n if req.top_n is not None else None]
        results = [
            {
                "index": i,
                "relevance_score": scores[i],
                **({"document": {"text": req.documents[i]}} if req.return_documents else {}),
            }
            for i in order
        ]
        total = usage(outs)["total_tokens"]
        return {
            "id": self.fe.new_id("rerank"),
            "model": self.fe.model_name,
            "usage": {"total_tokens": total},
            "results": results,
        }


def usage(outs: list[PoolingRequestOutput]) -> dict[str, int]:
    """OpenAI's usage of an embeddings answer: every input token is a prompt token."""
    tokens = sum(len(out.prompt_token_ids) for out in outs)
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


def encode(vector: torch.Tensor, encoding_format: str) -> list[float] | str:
    """A vector as OpenAI sends it: floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.float().numpy().astype("<f4").tobytes()).decode()
    return vector.tolist()


def add_pooling_routes(app: FastAPI, fe: Frontend, errors: dict) -> None:
    """The pooling endpoints on ``app`` (``errors``: the statuses they document, as the other routes')."""
    server = PoolingServer(fe)

    @app.post("/v1/embeddings", responses=errors)
    async def embeddings(req: EmbeddingRequest, raw: Request) -> dict[str, Any]:
        fe.check_model(req.model)
        return await server.vectors(raw, req, "embedding")

    @app.post("/pooling", responses=errors)
    async def pooling(req: PoolingRequest, raw: Request) -> dict[str, Any]:
        fe.check_model(req.model)
        return await server.vectors(raw, req, "pooling")

    @app.post("/classify", responses=errors)
    async def classify(req: ClassificationRequest, raw: Request) -> dict[str, Any]:
        fe.check_model(req.model)
        return await server.classify(raw, req)

    async def score(req: ScoreRequest, raw: Request) -> dict[str, Any]:
        fe.check_model(req.model)
        return await server.score(raw, req)

    async def rerank(req: RerankRequest, raw: Request) -> dict[str, Any]:
        fe.check_model(req.model)
        return await server.rerank(raw, req)

    for path in ("/score", "/v1/score"):
        app.post(path, responses=errors)(score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.post(path, responses=errors)(rerank)
