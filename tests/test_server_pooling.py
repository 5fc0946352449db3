"""The pooling endpoints of ``core serve`` on all-MiniLM-L6-v2 (``--runner auto`` picks pooling):
embeddings in every input form and encoding, score, rerank, pooling, and the 400s; and a
generation server's answer to a pooling request."""

from __future__ import annotations

import base64
import re

import httpx
import numpy as np
import openai
import pytest

pytest.importorskip("sentence_transformers")
minilm_package = pytest.importorskip("all_minilm_l6_v2")

MODEL = "minilm"
DOCS = ["A man is eating a piece of bread.", "The girl is carrying a baby.", "A man is riding a horse.", "Stocks fell."]
QUERY = "A man is eating food."


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    return minilm_package.extract_model(str(tmp_path_factory.mktemp("minilm")))


@pytest.fixture(scope="module")
def server(minilm_dir, start_server):
    proc = start_server(
        minilm_dir, "--served-model-name", MODEL, "--max-num-batched-tokens", "64", "--drain-timeout", "0"
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def http(server):
    client = httpx.Client(base_url=server.url, timeout=60)
    yield client
    client.close()


def embed(http, value, **fields) -> list[list[float]]:
    response = http.post("/v1/embeddings", json={"model": MODEL, "input": value, **fields})
    assert response.status_code == 200, response.text
    return [item["embedding"] for item in response.json()["data"]]


def test_embeddings_match_sentence_transformers_in_every_input_form(server, http, minilm_dir):
    from sentence_transformers import SentenceTransformer

    assert "with the pooling runner" in server.log
    expected = SentenceTransformer(str(minilm_dir), device="cpu").encode(DOCS, normalize_embeddings=True)
    response = http.post("/v1/embeddings", json={"model": MODEL, "input": DOCS})
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == list(range(len(DOCS)))
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert (vectors * expected).sum(-1).min() >= 0.9999
    ids = [http.post("/tokenize", json={"prompt": d}).json()["tokens"] for d in DOCS]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == sum(map(len, ids))
    # the same rows in the same step: the same floats; one text alone against it among the four: a
    # step's row count may pick another kernel (cpu_x86 on AMX: the tile unit from 24 rows, within
    # 2^-15 of sum |x w| a product), so ~1e-6 apart on these unit vectors
    np.testing.assert_allclose(embed(http, ids), vectors, atol=1e-6)
    alone = embed(http, DOCS[0])[0]
    np.testing.assert_allclose(embed(http, ids[0])[0], alone, atol=1e-6)
    np.testing.assert_allclose(alone, vectors[0], atol=1e-5)
    np.testing.assert_allclose(embed(http, ids[1])[0], vectors[1], atol=1e-5)
    (b64,) = embed(http, DOCS[2], encoding_format="base64")
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(b64), dtype="<f4"), embed(http, DOCS[2])[0], atol=1e-6)
    metrics = http.get("/metrics").text
    assert re.search(r'^core:request_success_total\{finished_reason="stop",model_name="minilm"\} (\d+)', metrics, re.M)
    prompt_tokens = re.search(r"^core:prompt_tokens_total\{[^}]*\} (\S+)$", metrics, re.M)
    assert prompt_tokens and float(prompt_tokens.group(1)) >= 2 * sum(map(len, ids)) + len(ids[1])


def test_openai_client_embeddings(server):
    """The OpenAI SDK asks for base64 and decodes it itself."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    result = client.embeddings.create(model=MODEL, input=[QUERY, DOCS[0]])
    assert len(result.data) == 2 and len(result.data[0].embedding) == 384
    assert abs(np.linalg.norm(result.data[0].embedding) - 1) < 1e-5
    assert result.usage.prompt_tokens > 0


def test_score_and_rerank_are_cosine(http):
    vectors = np.array(embed(http, [QUERY, *DOCS]))
    cosines = vectors[1:] @ vectors[0]
    for path in ("/score", "/v1/score"):
        body = http.post(path, json={"model": MODEL, "text_1": QUERY, "text_2": DOCS}).json()
        assert [d["index"] for d in body["data"]] == list(range(len(DOCS)))
        np.testing.assert_allclose([d["score"] for d in body["data"]], cosines, atol=1e-5)
    pairs = http.post("/score", json={"text_1": DOCS[:2], "text_2": DOCS[2:]}).json()["data"]
    np.testing.assert_allclose(
        [d["score"] for d in pairs], [vectors[1] @ vectors[3], vectors[2] @ vectors[4]], atol=1e-5
    )
    order = list(np.argsort(-cosines))
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        body = http.post(path, json={"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": 3}).json()
        assert [r["index"] for r in body["results"]] == order[:3], path
        assert body["results"][0]["document"] == {"text": DOCS[order[0]]}
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], cosines[order[:3]], atol=1e-5)
        assert body["usage"]["total_tokens"] > 0


def test_pooling_endpoint_and_options(http):
    body = http.post("/pooling", json={"input": [QUERY], "normalize": False}).json()
    assert body["data"][0]["object"] == "pooling" and len(body["data"][0]["data"]) == 384
    assert abs(np.linalg.norm(body["data"][0]["data"]) - 1) > 0.01  # as pooled, not normalized
    long_text = " ".join(["A long sentence about serving engines, batching and attention."] * 30)
    (cut,) = embed(http, long_text, truncate_prompt_tokens=-1)
    assert abs(np.linalg.norm(cut) - 1) < 1e-5


@pytest.mark.parametrize(
    "path,fields,param,why",
    [
        ("/v1/embeddings", {"input": QUERY, "dimensions": 64}, "dimensions", "matryoshka"),
        ("/v1/embeddings", {"input": " ".join(["word"] * 400)}, "input", "at most 256"),
        ("/v1/embeddings", {"input": [5, 10**6]}, "input", "outside the vocabulary"),
        ("/v1/embeddings", {"input": []}, "input", "must not be empty"),
        ("/v1/embeddings", {"input": QUERY, "encoding_format": "hex"}, "encoding_format", ""),
        ("/v1/embeddings", {"input": QUERY, "truncate_prompt_tokens": -2}, "truncate_prompt_tokens", ""),
        ("/score", {"text_1": DOCS[:2], "text_2": DOCS[:3]}, "text_1", "1 and N"),
        ("/rerank", {"query": QUERY, "documents": []}, "documents", ""),
        ("/classify", {"input": QUERY}, "model", "no classification head"),
        ("/v1/completions", {"prompt": QUERY}, "model", "pooling runner"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUERY}]}, "model", "pooling runner"),
    ],
)
def test_bad_requests_are_400_naming_the_field(http, path, fields, param, why):
    response = http.post(path, json={"model": MODEL, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and why in error["message"], error


def test_openapi_documents_the_pooling_routes(http):
    schema = http.get("/openapi.json").json()
    for path in (
        "/v1/embeddings",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
    ):
        responses = schema["paths"][path]["post"]["responses"]
        assert "422" not in responses and {"200", "400", "404", "413", "503"} <= set(responses), path


def test_fuzzed_pooling_requests_get_no_5xx(server):
    """Schemathesis over the pooling routes (bodies that fit their schema, then ones that break it)."""
    import itertools

    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [r.ok() for r in schema.include(method="POST").get_all_operations()]
    operations = [op for op in operations if op.path not in ("/v1/completions", "/v1/chat/completions")]
    assert len(operations) == 10, [op.label for op in operations]  # the 8 pooling routes, /tokenize, /detokenize
    statuses: list[int] = []
    for operation, mode in itertools.product(operations, GenerationMode):

        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(case=operation.as_strategy(mode))
        def call(case):
            response = case.call(timeout=60)
            statuses.append(response.status_code)
            assert response.status_code < 500, (case.path, case.body, response.text)

        call()
    assert statuses.count(200) >= 10 and statuses.count(400) >= 15, statuses


def test_generation_server_refuses_pooling_requests(tiny_llama, start_server):
    proc = start_server(tiny_llama, "--drain-timeout", "0")
    try:
        with httpx.Client(base_url=proc.url, timeout=60) as http:
            for path, body in (("/v1/embeddings", {"input": "x"}), ("/rerank", {"query": "x", "documents": ["y"]})):
                response = http.post(path, json=body)
                assert response.status_code == 400, response.text
                assert "generate runner" in response.json()["error"]["message"]
    finally:
        proc.stop()
