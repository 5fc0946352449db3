"""The server's own logic in-process, on a scripted engine: no model, so it runs in seconds.

The fake engine counts upward from the last prompt token (one character per token) and
honours ``max_tokens``, ``n`` and aborts; enough to check framing, deltas, usage, admission
and disconnects exactly. ``test_server.py`` covers the real engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import uvicorn
from core.async_engine import AsyncEngine
from core.cli import chat_template_arg
from core.outputs import CompletionOutput, RequestMetrics, RequestOutput
from core.server.app import _Server, build_app
from core.server.frontend import Frontend
from core.server.protocol import ChatMessage

VOCAB = 128


class CharTokenizer:
    """One token per ASCII character."""

    chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}>"
    special_tokens_map = {"eos_token": "$"}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


class FakeEngine:
    """The slice of :class:`core.engine.LLMEngine` the server uses, generating ``last + 1`` forever."""

    def __init__(self, step_seconds: float = 0.002) -> None:
        self.tokenizer = CharTokenizer()
        self.config = SimpleNamespace(max_model_len=64, runner="generate")
        self.platform = SimpleNamespace(place_frontend_thread=lambda: None)
        self.loaded = SimpleNamespace(hf_config=SimpleNamespace(vocab_size=VOCAB), name="fake")
        self.requests: dict[str, dict] = {}
        self.arrivals: dict[str, tuple[float, float]] = {}  # request id -> (its arrival stamp, when it was added)
        self.step_seconds = step_seconds
        self.num_finished = 0

    def add_request(
        self,
        request_id,
        prompt=None,
        params=None,
        prompt_token_ids=None,
        arrival_time=None,
        priority=0,
        lora_request=None,
    ):
        if any(t >= VOCAB for t in prompt_token_ids):
            raise ValueError("token id outside the vocabulary")
        self.arrivals[request_id] = (arrival_time, time.time())
        self.requests[request_id] = {"ids": prompt_token_ids, "params": params, "outs": [[] for _ in range(params.n)]}

    def abort_request(self, request_id):
        self.requests.pop(request_id, None)

    def check_health(self):
        pass  # no workers to watch

    def shutdown(self):
        pass  # no workers to stop

    def has_unfinished_requests(self):
        return bool(self.requests)

    def step(self):
        time.sleep(self.step_seconds)
        outputs = []
        for request_id, r in list(self.requests.items()):
            for out in r["outs"]:
                out.append(((out[-1] if out else r["ids"][-1]) + 1) % VOCAB)
            done = len(r["outs"][0]) >= (r["params"].max_tokens or self.config.max_model_len - len(r["ids"]))
            completions = [
                CompletionOutput(i, self.tokenizer.decode(o), list(o), finish_reason="length" if done else None)
                for i, o in enumerate(r["outs"])
            ]
            now = time.time()
            metrics = RequestMetrics(
                arrival_time=now - 0.01, first_token_time=now, last_token_time=now, finished_time=now
            )
            outputs.append(RequestOutput(request_id, None, r["ids"], None, completions, done, metrics))
            if done:
                del self.requests[request_id]
                self.num_finished += 1
        return outputs

    def stats(self):
        return {"num_running": len(self.requests), "num_waiting": 0, "kv_usage": 0.1 * len(self.requests),
                "prefix_cache_queries": 0, "prefix_cache_hits": 0, "num_preemptions": 0,
                "num_total_blocks": 8, "block_size": 16, "kv_cache_dtype": "float32"}  # fmt: skip


def test_engine_thread_is_bound_and_the_front_end_moves_to_its_cpus():
    import os

    engine = FakeEngine()
    bound_in, allowed = [], sorted(os.sched_getaffinity(0))
    engine.platform = SimpleNamespace(
        init_device=lambda config: bound_in.append(threading.current_thread().name),
        place_frontend_thread=lambda: os.sched_setaffinity(0, allowed[-1:]),
    )
    result = {}

    def build():  # what LLMEngine's constructor does first: set up the device in the calling thread
        engine.platform.init_device(None)
        return engine

    def front_end():  # on its own thread: the affinity change must not leak into the test process
        async_engine = AsyncEngine(build)
        result["cpus"] = sorted(os.sched_getaffinity(0))
        async_engine.shutdown()

    thread = threading.Thread(target=front_end)
    thread.start()
    thread.join(10)
    assert bound_in == ["core-engine"] and result["cpus"] == allowed[-1:]


@pytest.fixture(scope="module")
def fake_server():
    engine = FakeEngine()
    async_engine = AsyncEngine(lambda: engine)
    fe = Frontend(async_engine, "fake", max_queue_len=4)
    app = build_app(fe, api_key=None, max_request_bytes=4096)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}", engine=engine, fe=fe)
    server.should_exit = True
    thread.join(10)


def test_completion_counts_and_usage(fake_server):
    body = {"prompt": "ab", "max_tokens": 3, "n": 2, "logprobs": None}
    out = httpx.post(f"{fake_server.url}/v1/completions", json=body).json()
    assert [c["text"] for c in out["choices"]] == ["cde", "cde"]
    assert out["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 6,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_arrival_is_stamped_when_the_http_request_comes_in(fake_server):
    """The body trickles in over 0.3 s: the stamp precedes it, the engine gets it after."""
    body = json.dumps({"prompt": "abc", "max_tokens": 2}).encode()

    def trickle():
        yield body[:5]
        time.sleep(0.3)
        yield body[5:]

    sent = time.time()
    out = httpx.post(
        f"{fake_server.url}/v1/completions", content=trickle(), headers={"content-type": "application/json"}
    )
    done = time.time()
    assert out.status_code == 200
    arrival, added = fake_server.engine.arrivals[f"{out.json()['id']}-0"]
    assert sent <= arrival < sent + 0.25 and sent + 0.3 <= added <= done


def test_stream_deltas_join_to_the_whole(fake_server):
    body = {
        "prompt": ["ab", "xy"],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "echo": True,
    }
    with httpx.stream("POST", f"{fake_server.url}/v1/completions", json=body) as r:
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    text = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk["choices"]:
            text[choice["index"]] += choice["text"]
    assert text == {0: "abcdef", 1: "xyz{|}"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


def test_chat_stream(fake_server):
    body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{fake_server.url}/v1/chat/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "?@"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_errors_are_openai_shaped(fake_server):
    url = fake_server.url
    cases = [
        (httpx.post(f"{url}/v1/completions", content=b"{", headers={"content-type": "application/json"}), 400),
        (httpx.post(f"{url}/v1/completions", json={"prompt": "a", "temperature": -1}), 400),
        (httpx.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 64}), 400),
        (httpx.post(f"{url}/v1/completions", json={"prompt": "a", "model": "x"}), 404),
        (httpx.post(f"{url}/v1/completions", json={"prompt": "a" * 5000}), 413),
        (httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "a"}]}), 400),
    ]
    for response, status in cases:
        assert response.status_code == status, response.text
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_disconnect_aborts_and_queue_limit(fake_server):
    url = fake_server.url
    fake_server.engine.step_seconds = 0.05  # slow enough that the requests pile up

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"prompt": "a", "max_tokens": 60, "stream": True}
            streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(8)]
            responses = await asyncio.gather(*(s.__aenter__() for s in streams))
            statuses = [r.status_code for r in responses]
            for s in streams:
                await s.__aexit__(None, None, None)
            return statuses

    try:
        statuses = asyncio.run(run())
    finally:
        fake_server.engine.step_seconds = 0.002
    assert statuses.count(503) >= 1 and statuses.count(200) >= 4
    deadline = time.monotonic() + 5
    # the server learns of each disconnect asynchronously: wait for both to drain
    while (fake_server.engine.requests or fake_server.fe.num_queued) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not fake_server.engine.requests  # every stream the clients left was aborted
    assert fake_server.fe.num_queued == 0


def test_serve_chat_template_is_the_default_of_chat_requests(tmp_path):
    """``core serve --chat-template``: a file's text or an inline template, used by chat requests
    that bring none; a request's own template wins."""
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    assert chat_template_arg(str(template)) == "{{ messages[0]['content'] }}"
    assert chat_template_arg("{% for m in messages %}{{ m['content'] }}{% endfor %}").startswith("{% for")
    with pytest.raises(argparse.ArgumentTypeError, match="neither a file nor a Jinja template"):
        chat_template_arg(str(tmp_path / "missing.jinja"))
    engine = FakeEngine()
    messages = [ChatMessage(role="user", content="hi")]

    served = Frontend(AsyncEngine(lambda: engine), "fake", 4, chat_template="{{ eos_token }}{{ messages[0].content }}")
    trusting = Frontend(AsyncEngine(lambda: engine), "fake", 4, trust_request_chat_template=True)

    async def render():
        try:
            renders = [(served, None), (trusting, None), (trusting, "{{ messages[0].role }}!")]
            return [engine.tokenizer.decode(await fe.render_chat(messages, True, t)) for fe, t in renders]
        finally:
            await served.close()
            await trusting.close()

    # the server's template; the model's own; a request's own (trusted)
    assert asyncio.run(render()) == ["$hi", "<user>hi>", "user!"]


def test_the_ready_line_names_the_address_bound(caplog):
    """Bound to every interface, the line says so (0.0.0.0, reachable from other machines), not "localhost"."""
    fe = Frontend(AsyncEngine(FakeEngine), "fake", max_queue_len=4)
    config = uvicorn.Config(build_app(fe), host="0.0.0.0", port=0, log_level="warning", lifespan="on")
    server = _Server(config, fe, drain_timeout=0)
    thread = threading.Thread(target=server.run, daemon=True)
    with caplog.at_level(logging.INFO, logger="core.server.app"):
        thread.start()
        while not server.started and thread.is_alive():
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        server.should_exit = True
        thread.join(10)
    assert f"ready: serving on http://0.0.0.0:{port} (every network interface" in caplog.text, caplog.text
