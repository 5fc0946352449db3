"""``core serve`` end to end: a real server process, driven with the OpenAI SDK and httpx."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time

import httpx
import openai
import pytest

MODEL = "tiny"
KEY = "sekret"
MAX_MODEL_LEN = 512
MAX_QUEUE_LEN = 40
MAX_REQUEST_BYTES = 65536
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def server(tiny_llama, start_server):
    proc = start_server(
        tiny_llama,
        "--device", "auto", "--dtype", "float32", "--served-model-name", MODEL, "--api-key", KEY,
        "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--max-queue-len", str(MAX_QUEUE_LEN),
        "--max-request-bytes", str(MAX_REQUEST_BYTES), "--drain-timeout", "0",
    )  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def metric(text: str, name: str) -> float:
    """The value of one sample of the Prometheus exposition ``text``, labels ignored."""
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def tokenize(http, text: str) -> list[int]:
    return http.post("/tokenize", json={"prompt": text}).json()["tokens"]


# -- plain endpoints ------------------------------------------------------------------------
def test_models_version_health(server, http, client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert http.get("/version").json()["version"]
    assert http.get("/health").status_code == 200
    assert "serving tiny on" in server.log and "KV cache" in server.log


def test_tokenize_detokenize_round_trip(http):
    body = http.post("/tokenize", json={"prompt": "Hello there, world"}).json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == MAX_MODEL_LEN
    assert http.post("/detokenize", json={"tokens": body["tokens"]}).json()["prompt"].endswith("Hello there, world")
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > body["count"] - 3  # the template wraps the message in role markers


# -- completions ----------------------------------------------------------------------------
def test_completion_usage_and_finish(http, client):
    prompt = "The capital of France is"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7, extra_body={"ignore_eos": True}, **GREEDY)
    assert out.object == "text_completion" and out.model == MODEL
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(tokenize(http, prompt))
    assert out.usage.completion_tokens == 7
    assert out.usage.total_tokens == out.usage.prompt_tokens + 7


def test_completion_stream_equals_non_stream(client):
    kwargs = dict(model=MODEL, prompt="Once upon a time", max_tokens=24, **GREEDY)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completion_prompt_forms_agree(http, client):
    texts = ["Hello there", "A quick brown fox"]
    by_text = client.completions.create(model=MODEL, prompt=texts, max_tokens=6, n=2, **GREEDY)
    assert sorted(c.index for c in by_text.choices) == [0, 1, 2, 3]
    text_of = {c.index: c.text for c in by_text.choices}
    assert text_of[0] == text_of[1] and text_of[2] == text_of[3]  # greedy: the n copies agree
    ids = [tokenize(http, t) for t in texts]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, **GREEDY)
    assert [c.text for c in sorted(by_ids.choices, key=lambda c: c.index)] == [text_of[0], text_of[2]]
    one = client.completions.create(model=MODEL, prompt=ids[1], max_tokens=6, **GREEDY)
    assert one.choices[0].text == text_of[2]
    assert one.usage.prompt_tokens == len(ids[1])


def test_completion_echo_and_logprobs(client):
    out = client.completions.create(model=MODEL, prompt="Red green", max_tokens=5, logprobs=3, echo=True, **GREEDY)
    choice = out.choices[0]
    assert choice.text.startswith("Red green")
    lp = choice.logprobs
    n_prompt = out.usage.prompt_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == n_prompt + out.usage.completion_tokens
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)
    for token, logprob, top in zip(
        lp.tokens[n_prompt:], lp.token_logprobs[n_prompt:], lp.top_logprobs[n_prompt:], strict=True
    ):
        assert 1 <= len(top) <= 4
        assert logprob == pytest.approx(max(top.values()))  # greedy picks the most likely token
        assert top[token] == pytest.approx(logprob)


def test_completion_sampling_fields_reach_the_engine(http, client):
    base = dict(model=MODEL, prompt="Count: one two", max_tokens=12)
    seeded = dict(temperature=1.0, seed=1234, extra_body={"top_k": 20, "min_p": 0.01, "presence_penalty": 0.5})
    a = client.completions.create(**base, **seeded)
    b = client.completions.create(**base, **seeded)
    assert a.choices[0].text == b.choices[0].text  # seeded sampling repeats

    (the,) = http.post("/tokenize", json={"prompt": " the", "add_special_tokens": False}).json()["tokens"]
    forced = client.completions.create(**{**base, "max_tokens": 3}, **GREEDY, logit_bias={str(the): 100})
    assert forced.choices[0].text == http.post("/detokenize", json={"tokens": [the] * 3}).json()["prompt"]

    stop_now = client.completions.create(
        **base, **GREEDY, logit_bias={str(the): 100}, extra_body={"stop_token_ids": [the]}
    )
    assert stop_now.choices[0].finish_reason == "stop" and stop_now.usage.completion_tokens == 1
    assert stop_now.choices[0].model_extra["stop_reason"] == the
    later = client.completions.create(
        **base, **GREEDY, logit_bias={str(the): 100}, extra_body={"stop_token_ids": [the], "min_tokens": 2}
    )
    assert later.usage.completion_tokens == 3  # the stop token is held back until min_tokens

    greedy = client.completions.create(**base, **GREEDY, extra_body={"ignore_eos": True}).choices[0].text
    assert len(greedy) > 6, greedy
    stop = greedy[3:6]
    cut = client.completions.create(**base, **GREEDY, stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == greedy[: greedy.index(stop)]
    kept = client.completions.create(
        **base, **GREEDY, stop=stop, extra_body={"ignore_eos": True, "include_stop_str_in_output": True}
    ).choices[0]
    assert kept.text == greedy[: greedy.index(stop) + len(stop)]


# -- chat -----------------------------------------------------------------------------------
def test_chat_roles_parts_and_usage(http, client):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "again"},
    ]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=5, n=2, **GREEDY)
    assert out.object == "chat.completion" and len(out.choices) == 2
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == out.choices[1].message.content
    rendered = http.post("/tokenize", json={"messages": messages}).json()
    assert out.usage.prompt_tokens == rendered["count"]
    assert 2 <= out.usage.completion_tokens <= 10  # two choices of at most 5 tokens


def test_chat_stream_equals_non_stream_with_logprobs(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=16, **GREEDY)
    whole = client.chat.completions.create(logprobs=True, top_logprobs=2, **kwargs)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert all(
        len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob == pytest.approx(item.logprob) for item in content
    )
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]


def test_raw_sse_framing(http):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])


# -- errors ---------------------------------------------------------------------------------
def _completion(**fields):
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 4, **fields}


def _chat(**fields):
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **fields}


BAD_REQUESTS = [
    ("/v1/completions", {"prompt": "Hi"}, 404, "unknown model", {"model": "nope"}),
    ("/v1/completions", None, 400, "missing prompt", {"prompt": None}),
    ("/v1/completions", None, 400, "wrong type", {"temperature": "hot"}),
    ("/v1/completions", None, 400, "temperature < 0", {"temperature": -1}),
    ("/v1/completions", None, 400, "top_p 0", {"top_p": 0}),
    ("/v1/completions", None, 400, "top_p > 1", {"top_p": 1.5}),
    ("/v1/completions", None, 400, "n < 1", {"n": 0}),
    ("/v1/completions", None, 400, "max_tokens < 1", {"max_tokens": 0}),
    ("/v1/completions", None, 400, "beyond the model length", {"max_tokens": MAX_MODEL_LEN}),
    ("/v1/completions", None, 400, "suffix", {"suffix": "end"}),
    ("/v1/completions", None, 400, "token id outside the vocabulary", {"prompt": [1, 10**9]}),
    ("/v1/completions", None, 400, "empty prompt", {"prompt": []}),
    ("/v1/completions", None, 400, "logit_bias outside the vocabulary", {"logit_bias": {"999999999": 5}}),
    ("/v1/completions", None, 400, "logprobs > 20", {"logprobs": 21}),
    ("/v1/completions", None, 400, "presence_penalty", {"presence_penalty": 3}),
    ("/v1/chat/completions", None, 400, "unknown role", {"messages": [{"role": "wizard", "content": "Hi"}]}),
    ("/v1/chat/completions", None, 400, "no messages", {"messages": []}),
    ("/v1/chat/completions", None, 400, "image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    ("/v1/chat/completions", None, 400, "top_logprobs without logprobs", {"top_logprobs": 2}),
    ("/v1/chat/completions", None, 400, "min_tokens > max_tokens", {"max_tokens": 2, "min_tokens": 5}),
    ("/v1/chat/completions", None, 404, "unknown model", {"model": "gpt-4"}),
    ("/detokenize", {"tokens": [10**9]}, 400, "token outside the vocabulary", {}),
    # every input error is a 400 before any stream begins (issue 45)
    ("/v1/completions", None, 400, "streamed token id outside the vocabulary", {"prompt": [1, 10**9], "stream": True}),
    ("/v1/completions", None, 400, "streamed beyond the model length", {"max_tokens": MAX_MODEL_LEN, "stream": True}),
    ("/v1/completions", None, 400, "booleans as token ids", {"prompt": [True, 2]}),
    ("/v1/completions", None, 400, "a boolean n", {"n": True}),
    ("/v1/completions", None, 400, "more prompts than the queue ever holds", {"prompt": ["a"] * (MAX_QUEUE_LEN + 1)}),
    ("/v1/completions", None, 400, "lone surrogate", {"prompt": "hi \ud800"}),
    ("/v1/completions", None, 400, "streamed lone surrogate", {"prompt": "hi \ud800", "stream": True}),
    ("/v1/completions", None, 400, "lone surrogate stop", {"stop": ["\udfff"]}),
    ("/tokenize", {"prompt": "hi \ud800"}, 400, "lone surrogate to tokenize", {}),
    ("/v1/chat/completions", None, 400, "lone surrogate in a message", {"messages": [{"role": "user", "content": "\ud800"}]}),
    ("/v1/chat/completions", None, 400, "request template untrusted", {"chat_template": "{{ messages }}"}),
    ("/v1/chat/completions", None, 400, "template kwargs replace messages", {"chat_template_kwargs": {"messages": []}}),
    ("/tokenize", {"tokens": [True]}, 400, "neither prompt nor messages", {}),
    ("/detokenize", {"tokens": [True]}, 400, "a boolean token", {}),
]  # fmt: skip

# what the 400s above must name (the field, and for a few, the words a user needs)
EXPECTED_WORDS = {
    "streamed token id outside the vocabulary": ["prompt", "vocabulary"],
    "booleans as token ids": ["prompt", "a list of integers"],
    "more prompts than the queue ever holds": ["--max-queue-len"],
    "lone surrogate": ["prompt", "surrogate"],
    "streamed lone surrogate": ["prompt", "surrogate"],
    "lone surrogate in a message": ["messages.0.content", "surrogate"],
    "request template untrusted": ["--trust-request-chat-template"],
    "image part": ["text only"],
}


@pytest.mark.parametrize(("path", "base", "status", "why", "fields"), BAD_REQUESTS, ids=[b[3] for b in BAD_REQUESTS])
def test_bad_request_answers_in_openai_shape(http, path, base, status, why, fields):
    body = (
        dict(base) if base is not None else (_completion() if "completions" in path and "chat" not in path else _chat())
    )
    body.update(fields)
    body = {k: v for k, v in body.items() if v is not None}
    # json.dumps escapes lone surrogates (as \ud800) where httpx's json= cannot encode them
    response = http.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    for word in EXPECTED_WORDS.get(why, ()):
        assert word in error["message"], error


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty", "presence_penalty", "min_p"])
@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_sampling_values_are_400(http, field, value):
    """Python's JSON parser reads Infinity and NaN: they are refused by name, not sampled with."""
    content = json.dumps(_completion()).replace("{", f'{{"{field}": {value}, ', 1)
    response = http.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field and "finite" in response.json()["error"]["message"]


def test_openapi_documents_the_statuses_served(http):
    schema = http.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        responses = schema["paths"][path]["post"]["responses"]
        assert "422" not in responses and {"200", "400", "401", "404", "413", "503"} <= set(responses), path
        assert responses["400"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorResponse"
        }
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_malformed_json_and_wrong_shapes(http):
    for content in (b'{"model": "tiny", "prompt": ', b"[1, 2]", b"", b"null"):
        response = http.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, content
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_body_too_large(http):
    big = _completion(prompt="x " * MAX_REQUEST_BYTES)
    assert http.post("/v1/completions", json=big).status_code == 413

    def chunked():  # no Content-Length: the limit holds while reading
        data = json.dumps(big).encode()
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    response = http.post("/v1/completions", content=chunked(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["message"]


def test_api_key_required(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = httpx.post(f"{server.url}/v1/completions", json=_completion(), headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/health").status_code == 200  # probes need no key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()


# -- load, disconnects, overload --------------------------------------------------------------
async def _stream_text(aclient, i: int, max_tokens: int) -> tuple[str, int]:
    stream = await aclient.completions.create(
        model=MODEL, prompt=f"Story number {i}:", max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, **GREEDY,
    )  # fmt: skip
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
        usage = chunk.usage or usage
    return text, usage.completion_tokens


def test_32_concurrent_streams_and_health_stays_fast(server, http):
    health_times = []
    stop = threading.Event()

    def probe():
        with httpx.Client(base_url=server.url) as probe_client:
            while not stop.is_set():
                start = time.perf_counter()
                assert probe_client.get("/health").status_code == 200
                health_times.append(time.perf_counter() - start)
                time.sleep(0.02)

    async def run():
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)
        return await asyncio.gather(*(_stream_text(aclient, i, 24) for i in range(32)))

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        results = asyncio.run(run())
    finally:
        stop.set()
        prober.join()
    assert all(n == 24 for _, n in results)
    # greedy and batched: the same prompt alone gives the same text
    alone = http.post(
        "/v1/completions", json=_completion(prompt="Story number 5:", max_tokens=24, ignore_eos=True, **GREEDY)
    )
    assert alone.json()["choices"][0]["text"] == results[5][0]
    assert health_times and sorted(health_times)[len(health_times) // 2] < 0.1 and max(health_times) < 0.5


def _wait_idle(http, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = http.get("/metrics").text
        if metric(text, "core:num_requests_running") == 0 and metric(text, "core:kv_cache_usage_perc") == 0:
            return text
        assert time.monotonic() < deadline, "requests still running after the clients left:\n" + text
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_the_request(server, http):
    body = _completion(prompt="Go on forever", max_tokens=400, ignore_eos=True, stream=True)
    with httpx.Client(base_url=server.url, headers=AUTH) as own:
        with own.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            assert '"error"' not in first, first + server.log[-3000:]
            before = http.get("/metrics").text
            assert metric(before, "core:num_requests_running") == 1, server.log[-3000:]
    # the client left after its first token; the engine must drop the request and its blocks
    text = _wait_idle(http)
    assert metric(text, "core:generation_tokens_total") < metric(before, "core:generation_tokens_total") + 400
    assert "core:time_to_first_token_seconds_bucket" in text and "core:e2e_request_latency_seconds_count" in text
    assert metric(text, "core:prompt_tokens_total") > 0


def test_disconnect_while_waiting_non_streaming(server, http):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=0.3,
                   json=_completion(max_tokens=MAX_MODEL_LEN - 10, ignore_eos=True))  # fmt: skip
    _wait_idle(http)


def test_queue_full_answers_503(server, http):
    num_requests = MAX_QUEUE_LEN + 40
    answered: list[int] = []

    async def one(aclient, everyone_answered: asyncio.Event):
        body = _completion(max_tokens=300, ignore_eos=True, stream=True)
        async with aclient.stream("POST", "/v1/completions", json=body) as response:
            answered.append(response.status_code)
            if len(answered) == num_requests:
                everyone_answered.set()
            if response.status_code != 200:
                return response.status_code, (await response.aread()).decode()
            await everyone_answered.wait()  # hold the slot until every request had its answer
            return 200, ""

    async def run():
        everyone_answered = asyncio.Event()
        limits = httpx.Limits(max_connections=num_requests)
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60, limits=limits) as aclient:
            return await asyncio.gather(*(one(aclient, everyone_answered) for _ in range(num_requests)))

    try:
        results = asyncio.run(run())
    except httpx.HTTPError:
        print("".join(line for line in server.lines if "uvicorn.access" not in line)[-5000:])
        raise
    statuses = [status for status, _ in results]
    assert set(statuses) == {200, 503}, statuses
    assert statuses.count(200) >= MAX_QUEUE_LEN
    overloaded = next(body for status, body in results if status == 503)
    assert json.loads(overloaded)["error"]["type"] == "server_overloaded"
    _wait_idle(http, timeout=30)  # every admitted stream was left: all aborted
    assert http.get("/health").status_code == 200


# -- structured outputs ---------------------------------------------------------------------
# a finite language: the grammar itself ends the answer, whatever the random model prefers
SMALL_SCHEMA = {
    "type": "object",
    "properties": {"a": {"enum": ["x", "yy"]}, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_response_format_json_schema(client, stream):
    response_format = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL_SCHEMA, "strict": True}}
    kwargs = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40}
    out = client.chat.completions.create(**kwargs, response_format=response_format, stream=stream, temperature=1.0)
    if stream:
        chunks = list(out)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        text, finish = out.choices[0].message.content, [out.choices[0].finish_reason]
    value = json.loads(text)
    assert value["a"] in ("x", "yy") and 0 <= value["b"] <= 9 and set(value) == {"a", "b"}
    assert finish == ["stop"]


def test_completion_structured_outputs_choice_and_regex(client):
    for structured, pattern in [({"choice": ["alpha", "beta"]}, r"alpha|beta"), ({"regex": r"[0-9]{3}"}, r"[0-9]{3}")]:
        out = client.completions.create(
            model=MODEL, prompt="Pick:", max_tokens=10, extra_body={"structured_outputs": structured}
        )
        assert re.fullmatch(pattern, out.choices[0].text) and out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"structured_outputs": {"regex": "(unclosed"}}, "regex"),
        ({"structured_outputs": {"json": {"type": "object", "not": {}}}}, "not"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
        ({"structured_outputs": {"jsonn": {}}}, "jsonn"),
        ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}}, "not both"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
    ],
    ids=["bad regex", "unenforced keyword", "two kinds", "unknown field", "two ways", "no schema"],
)
def test_bad_constraints_are_400s_before_any_stream(http, fields, words):
    for stream in (False, True):
        response = http.post("/v1/chat/completions", json=_chat(stream=stream, **fields))
        assert response.status_code == 400, response.text
        assert words in response.json()["error"]["message"] and response.json()["error"]["param"], response.text


# -- tools ----------------------------------------------------------------------------------
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 3}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}},
]  # fmt: skip


def test_required_tool_choice_gives_valid_calls(client):
    import jsonschema

    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], max_tokens=60, temperature=1.0,
        tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    assert call.id.startswith("call_") and call.type == "function"


def test_named_tool_choice_streams_the_call(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Time?"}], max_tokens=40, stream=True,
        tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    chunks = [c.choices[0] for c in stream if c.choices]
    deltas = [d for c in chunks for d in c.delta.tool_calls or ()]
    first = deltas[0]
    assert first.id.startswith("call_") and first.function.name == "get_time" and first.function.arguments == ""
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments)["zone"] in ("UTC", "CET")
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["tool_calls"]


def test_a_conversation_with_a_tool_result_is_answered(client):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]  # fmt: skip
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert out.choices[0].message.content and out.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"tools": TOOLS}, "--enable-auto-tool-choice"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "launch"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "constrains"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}, "tool_calls"),
    ],
    ids=["auto without the flag", "required without tools", "unknown named tool", "with response_format", "bad call"],
)
def test_tool_requests_that_cannot_be_served_are_400s(http, fields, words):
    response = http.post("/v1/chat/completions", json=_chat(**fields))
    assert response.status_code == 400 and words in response.json()["error"]["message"], response.text


# -- last: stops the module's server ---------------------------------------------------------
def test_sigterm_ends_streams_and_exits(server):
    """Last: stops the module's server. With --drain-timeout 0 the signal aborts at once."""
    body = _completion(prompt="Long", max_tokens=400, ignore_eos=True, stream=True)
    events = []
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as own:
        with own.stream("POST", "/v1/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 2:
                        server.proc.send_signal(signal.SIGTERM)
    finishes = [
        json.loads(e[6:])["choices"][0]["finish_reason"]
        for e in events
        if e.startswith("data: {") and '"choices":[{' in e
    ]
    assert "abort" in finishes and events[-1] == "data: [DONE]"
    assert server.proc.wait(20) == 0
