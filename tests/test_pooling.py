"""Pooling models (issue 39): all-MiniLM-L6-v2 against sentence-transformers, a random BERT classifier
against transformers, the default GGUF as an embedding model, and the pooling engine's rules."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("sentence_transformers")
minilm_package = pytest.importorskip("all_minilm_l6_v2")

from core import LLM  # noqa: E402

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "a",
    "Retrieval-augmented generation needs embeddings, similarity scores and reranking.",
    "Le chat est assis sur le tapis, et il regarde les oiseaux par la fenêtre.",
    "1234 5678 !!! ??? -- unusual tokens ### here",
    " ".join(["A long sentence about serving engines, batching and attention."] * 30),
]


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    return minilm_package.extract_model(str(tmp_path_factory.mktemp("minilm")))


@pytest.fixture(scope="module")
def llm(minilm_dir):
    """The checkpoint on the best available device, with a small step budget: several steps of several inputs."""
    engine = LLM(str(minilm_dir), max_num_batched_tokens=64)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def reference(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


def test_runner_is_chosen_from_the_checkpoint(llm):
    assert llm.engine.config.runner == "pooling"
    assert llm.engine.config.max_model_len == 256  # sentence_bert_config.json's max_seq_length
    assert (llm.engine.pooler.pooling_type, llm.engine.pooler.normalize) == ("mean", True)


def test_embeddings_match_sentence_transformers(llm, reference):
    ours = torch.stack([o.outputs.data for o in llm.embed(SENTENCES[:-1], use_tqdm=False)])
    expected = torch.from_numpy(reference.encode(SENTENCES[:-1], normalize_embeddings=True))
    assert ours.shape == expected.shape == (len(SENTENCES) - 1, 384)
    cosine = (ours * expected).sum(-1)
    assert cosine.min() >= 0.9999, cosine
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(ours)), atol=1e-5)


def test_bf16_weights_stay_within_0999_of_sentence_transformers(minilm_dir, reference):
    """``--quantization bf16``: the linears' weights and inputs rounded to bfloat16, float32 elsewhere."""
    from plugins.errors import UnsupportedFeature

    try:
        engine = LLM(str(minilm_dir), quantization="bf16")
    except UnsupportedFeature as exc:  # kernels without a bfloat16 product (e.g. no AVX512_BF16)
        pytest.skip(str(exc))
    try:
        ours = torch.stack([o.outputs.data for o in engine.embed(SENTENCES[:-1], use_tqdm=False)])
    finally:
        engine.shutdown()
    expected = torch.from_numpy(reference.encode(SENTENCES[:-1], normalize_embeddings=True))
    cosine = (ours * expected).sum(-1)
    assert cosine.min() >= 0.999, cosine


def test_long_input_is_refused_unless_truncated_as_sentence_transformers_does(llm, reference):
    with pytest.raises(ValueError, match="at most 256.*truncate_prompt_tokens"):
        llm.embed(SENTENCES[-1:], use_tqdm=False)
    (out,) = llm.embed(SENTENCES[-1:], use_tqdm=False, truncate_prompt_tokens=-1)
    assert len(out.prompt_token_ids) == 256
    expected = torch.from_numpy(reference.encode(SENTENCES[-1:], normalize_embeddings=True))[0]
    assert float(out.outputs.data @ expected) >= 0.9999


def test_token_ids_and_batching_give_the_same_vectors(llm):
    tokenizer = llm.get_tokenizer()
    by_text = llm.embed(SENTENCES[:4], use_tqdm=False)
    by_ids = llm.embed([tokenizer.encode(s) for s in SENTENCES[:4]], use_tqdm=False)
    alone = [llm.embed(s, use_tqdm=False)[0] for s in SENTENCES[:4]]
    for a, b, c in zip(by_text, by_ids, alone, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        torch.testing.assert_close(a.outputs.data, b.outputs.data, atol=1e-6, rtol=0)
        torch.testing.assert_close(a.outputs.data, c.outputs.data, atol=1e-5, rtol=0)


def test_score_is_cosine_and_ranks_like_it(llm):
    query, docs = SENTENCES[0], SENTENCES[1:5]
    scores = [s.outputs.score for s in llm.score(query, docs, use_tqdm=False)]
    vectors = [o.outputs.data for o in llm.embed([query, *docs], use_tqdm=False)]
    cosines = [float(vectors[0] @ v) for v in vectors[1:]]
    assert scores == pytest.approx(cosines, abs=1e-6)
    assert max(range(len(docs)), key=scores.__getitem__) == 0  # the bread sentence is the closest
    pairs = llm.score(SENTENCES[:2], SENTENCES[2:4], use_tqdm=False)
    assert [p.outputs.score for p in pairs] == pytest.approx(
        [float(vectors[0] @ vectors[2]), float(vectors[1] @ vectors[3])], abs=1e-6
    )


def test_unnormalized_and_errors(llm, minilm_dir):
    (raw,) = llm.embed("A man is eating food.", use_tqdm=False, normalize=False)
    assert abs(float(raw.outputs.data.norm()) - 1) > 0.01
    with pytest.raises(ValueError, match="matryoshka"):
        llm.embed("x", use_tqdm=False, dimensions=32)
    with pytest.raises(ValueError, match="pooling runner"):
        llm.generate(["x"], use_tqdm=False)
    with pytest.raises(ValueError, match="no classification head"):
        llm.classify("x", use_tqdm=False)
    with pytest.raises(ValueError, match="encoder: it cannot generate"):
        LLM(str(minilm_dir), runner="generate")


def random_bert_classifier(directory, minilm_dir, num_labels: int):
    """A random-weight BertForSequenceClassification from a transformers config, saved with MiniLM's tokenizer."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        num_labels=num_labels, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(num_labels)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, directory / name)
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["BertForSequenceClassification"]
    return model


def test_random_bert_classifier_matches_transformers(minilm_dir, tmp_path):
    """3 labels: the same probabilities (softmax) as transformers."""
    model = random_bert_classifier(tmp_path, minilm_dir, num_labels=3)
    llm = LLM(str(tmp_path), max_num_batched_tokens=32)
    try:
        outs = llm.classify(SENTENCES[:4], use_tqdm=False)
        tokenizer = llm.get_tokenizer()
        for sentence, out in zip(SENTENCES[:4], outs, strict=True):
            with torch.no_grad():
                logits = model(**tokenizer(sentence, return_tensors="pt")).logits[0]
            torch.testing.assert_close(out.outputs.data, torch.softmax(logits, -1), atol=1e-5, rtol=0)
    finally:
        llm.shutdown()


def test_random_cross_encoder_scores_like_transformers(minilm_dir, tmp_path):
    """1 label: score(query, docs) is the sigmoid of the head on each (query, doc) pair, token types included."""
    model = random_bert_classifier(tmp_path, minilm_dir, num_labels=1)
    llm = LLM(str(tmp_path))
    try:
        assert (
            llm.engine.config.max_num_batched_tokens >= 2048
        )  # a pooling step's default, above the CPU platform's 160 on 2 cores
        scores = [s.outputs.score for s in llm.score(SENTENCES[0], SENTENCES[1:5], use_tqdm=False)]
        tokenizer = llm.get_tokenizer()
        with torch.no_grad():
            pairs = tokenizer([SENTENCES[0]] * 4, SENTENCES[1:5], padding=True, return_tensors="pt")
            expected = torch.sigmoid(model(**pairs).logits[:, 0])
            no_types = torch.sigmoid(model(pairs["input_ids"], attention_mask=pairs["attention_mask"]).logits[:, 0])
        assert scores == pytest.approx(expected.tolist(), abs=1e-5)
        assert scores != pytest.approx(no_types.tolist(), abs=1e-5)  # the second segment's token type matters
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_default_gguf_as_an_embedding_model():
    """``runner="pooling"`` on the default decoder: transformers' normalized last-token hidden state."""
    import transformers
    from core.loader.source import default_model_path

    path = default_model_path()
    llm = LLM(None, runner="pooling")
    try:
        assert (llm.engine.pooler.pooling_type, llm.engine.pooler.normalize) == ("last", True)
        hf = transformers.AutoModel.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        for out in llm.embed(SENTENCES[:3], use_tqdm=False):
            with torch.no_grad():
                hidden = hf(torch.tensor([out.prompt_token_ids])).last_hidden_state[0, -1]
            cosine = float(out.outputs.data @ torch.nn.functional.normalize(hidden, dim=0))
            assert cosine >= 0.999, cosine
    finally:
        llm.shutdown()


def test_server_scores_and_reranks_with_a_cross_encoder(minilm_dir, tmp_path, start_server):
    """``core serve`` on a one-label BertForSequenceClassification: /score and /rerank are its pair scores."""
    import httpx

    random_bert_classifier(tmp_path, minilm_dir, num_labels=1)
    llm = LLM(str(tmp_path))
    try:
        expected = [s.outputs.score for s in llm.score(SENTENCES[0], SENTENCES[1:5], use_tqdm=False)]
    finally:
        llm.shutdown()
    proc = start_server(tmp_path, "--drain-timeout", "0")
    try:
        with httpx.Client(base_url=proc.url, timeout=60) as http:
            body = http.post("/score", json={"text_1": SENTENCES[0], "text_2": SENTENCES[1:5]}).json()
            assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
            body = http.post("/v1/rerank", json={"query": SENTENCES[0], "documents": SENTENCES[1:5]}).json()
            order = sorted(range(4), key=lambda i: -expected[i])
            assert [r["index"] for r in body["results"]] == order
            assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
                [expected[i] for i in order], abs=1e-5
            )
            probs = http.post("/classify", json={"input": [SENTENCES[0]]}).json()["data"][0]
            assert probs["num_classes"] == 1 and 0 < probs["probs"][0] < 1
    finally:
        proc.stop()


def test_truncation_is_the_tokenizers_own(minilm_dir):
    """Texts and pairs cut around the special tokens exactly as the tokenizer's own truncation cuts them
    (``longest_first`` for pairs), without setting the shared tokenizer's truncation state."""
    import random

    import transformers
    from core.pooling.inputs import encode_pair, encode_text

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    rng = random.Random(1)
    words = "alpha beta gamma delta the of and serving engine attention".split()
    for _ in range(100):
        a, b = (" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(2))
        for k in (None, 3, 16, 17, 40, 200):
            cut = {} if k is None else {"truncation": True, "max_length": k}
            assert encode_text(tokenizer, a, k) == tokenizer.encode(a, **cut)
            cut = {} if k is None else {"truncation": "longest_first", "max_length": k}
            assert encode_pair(tokenizer, a, b, k) == tokenizer.encode(a, b, **cut)
