"""``core serve`` against a hostile client: templates that loop or bloat, huge prompts, fuzzed bodies.

One real server (tiny random Llama, SmolLM2's tokenizer) that trusts request chat templates, so
their budgets are what stands between an attacker and every other user.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

TEMPLATE_TIMEOUT_S = 1.5
MAX_MODEL_LEN = 512
ORIGIN = "https://app.example"
LOOPS_2 = "{% for a in range(100000) %}{% for b in range(3000) %}{% endfor %}{% endfor %}"
LOOPS_3 = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}{% endfor %}{% endfor %}"  # fmt: skip
BLOAT = "{{ 'hello ' * 16666667 }}"  # 100 MB from a 30-byte template
BLOAT_LOOP = "{% for a in range(100000) %}{{ 'hello ' * 1000 }}{% endfor %}"  # 600 MB, 6 kB at a time
HUGE = "{{ 'x' * 10000000000 }}"  # 10 GB at once


@pytest.fixture(scope="module")
def server(tiny_llama, start_server):
    proc = start_server(
        tiny_llama,
        "--device", "auto", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4",
        "--trust-request-chat-template", "--chat-template-timeout", str(TEMPLATE_TIMEOUT_S),
        "--allowed-origins", json.dumps([ORIGIN]), "--drain-timeout", "0",
    )  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def _chat(**fields):
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, **fields}


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


async def _attack_while_another_user_chats(url: str, template: str) -> tuple[httpx.Response, float, float]:
    """The attack's answer and seconds, and another user's chat's seconds, sent 0.2 s into the attack."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        start = time.monotonic()
        attack = asyncio.ensure_future(client.post("/v1/chat/completions", json=_chat(chat_template=template)))
        await asyncio.sleep(0.2)
        other_start = time.monotonic()
        other = await client.post("/v1/chat/completions", json=_chat())
        other_s = time.monotonic() - other_start
        assert other.status_code == 200, other.text
        attacked = await attack
        return attacked, time.monotonic() - start, other_s


@pytest.mark.parametrize(
    ("template", "words"),
    [(LOOPS_2, "did not finish"), (LOOPS_3, "did not finish"), (BLOAT, "budget"), (BLOAT_LOOP, "budget"),
     (HUGE, "memory budget")],
    ids=["two nested loops", "three nested loops", "100 MB output", "600 MB in a loop", "10 GB at once"],
)  # fmt: skip
def test_hostile_template_ends_as_a_400_within_its_budget(server, template, words):
    rss_before = _rss_bytes(server.proc.pid)
    attacked, attack_s, other_s = asyncio.run(_attack_while_another_user_chats(server.url, template))
    assert attacked.status_code == 400, attacked.text
    error = attacked.json()["error"]
    assert words in error["message"] and error["param"] == "chat_template", error
    assert attack_s < TEMPLATE_TIMEOUT_S + 3  # the render was stopped, not waited out
    assert other_s < 5  # another user's chat never queues behind the render
    assert _rss_bytes(server.proc.pid) - rss_before < 1 << 30  # the server did not take the bloat


def test_a_trusted_request_template_renders_and_a_stopped_worker_is_replaced(http):
    for _ in range(3):  # more renders than workers, after the hostile tests killed some
        ids = http.post("/tokenize", json={"prompt": "user says Hi"}).json()["tokens"]
        body = _chat(chat_template="{{ messages[0].role }} says {{ messages[0].content }}", max_tokens=1)
        out = http.post("/v1/chat/completions", json=body)
        assert out.status_code == 200, out.text
        assert out.json()["usage"]["prompt_tokens"] == len(ids) - (ids[0] == 1)  # no special tokens added


def test_server_template_output_is_capped_too(http):
    """The model's template renders a 3 MB message within the 16 MiB cap; the prompt is then
    refused as too long after a prefix of it is tokenized."""
    big = {"messages": [{"role": "user", "content": "hello world " * 250_000}]}
    response = http.post("/v1/chat/completions", json=big)
    assert response.status_code == 400 and "too long" in response.json()["error"]["message"], response.text


def test_huge_prompts_do_not_hold_up_a_small_one(server):
    """Four 2.4 MB prompts (each refused as too long after a prefix) beside a tiny completion."""

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            big = {"prompt": "hello world " * 200_000, "max_tokens": 4}
            bigs = [asyncio.ensure_future(client.post("/v1/completions", json=big)) for _ in range(4)]
            await asyncio.sleep(0.05)
            start = time.monotonic()
            small = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            small_s = time.monotonic() - start
            return await asyncio.gather(*bigs), small, small_s

    bigs, small, small_s = asyncio.run(run())
    assert small.status_code == 200 and small_s < 2.5, (small.text, small_s)
    for response in bigs:
        assert response.status_code == 400 and "too long" in response.json()["error"]["message"], response.text


def test_cors(http):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}  # fmt: skip
    response = http.options("/v1/chat/completions", headers=preflight)
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == ORIGIN
    assert (
        http.options("/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"}).status_code == 400
    )
    response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, headers={"Origin": ORIGIN})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == ORIGIN


def test_gauges_count_each_request_once(server, http):
    """16 streams on 4 sequence slots: running + waiting never exceeds the requests in flight."""
    num_requests = 16
    seen: list[float] = []

    def gauge(text: str, name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            body = {"prompt": "Once upon a time " * 20, "max_tokens": 48, "ignore_eos": True}
            requests = [asyncio.ensure_future(client.post("/v1/completions", json=body)) for _ in range(num_requests)]
            while not all(r.done() for r in requests):
                text = (await client.get("/metrics")).text
                seen.append(gauge(text, "core:num_requests_running") + gauge(text, "core:num_requests_waiting"))
                await asyncio.sleep(0.01)
            return [r.result().status_code for r in requests]

    assert asyncio.run(run()) == [200] * num_requests
    assert max(seen) <= num_requests and num_requests in seen, seen


# -- fuzzing: schemathesis over every POST route, on a bounded budget ----------------------------
FUZZ_EXAMPLES = 50  # a route and mode; each call is at most a few hundred tokens on the tiny model
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")


def test_fuzzed_requests_get_no_5xx_and_no_error_inside_a_200_stream(server):
    """Schemathesis draws bodies from the server's own OpenAPI schema: valid ones, then ones that break it."""
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.include(method="POST").get_all_operations()]
    # the pooling routes refuse a generative model whole: test_server_pooling.py fuzzes them on a pooling one
    operations = [op for op in operations if op.path in GENERATION_ROUTES]
    assert len(operations) == 4, [op.label for op in operations]
    statuses: list[int] = []
    for operation, mode in itertools.product(operations, GenerationMode):

        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(case=operation.as_strategy(mode))
        def call(case):
            response = case.call(timeout=60)
            statuses.append(response.status_code)
            assert response.status_code < 500, (case.body, response.text)
            if "text/event-stream" in " ".join(response.headers.get("content-type", [])):
                assert 'data: {"error"' not in response.text, (case.body, response.text)

        call()
    # both kinds were tried (random bodies that fit the schema mostly break a range the engine checks)
    assert statuses.count(200) >= 10 and statuses.count(400) >= FUZZ_EXAMPLES, statuses
