"""Admission while a step runs, on a real engine (tiny random Llama, reference platform).

The first step is held open (its real work runs once the test lets it go): requests added
meanwhile must keep the stamp of their arrival, wait in order, and enter the scheduler at
the very next step boundary, so their queue time and TTFT include the step they waited for.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from core.async_engine import AsyncEngine
from core.config import EngineConfig
from core.engine import LLMEngine
from core.sampling_params import SamplingParams
from plugins.reference import ReferencePlatform, tiny_model_config
from transformers import LlamaForCausalLM

HELD_S = 0.3  # how long the first step is held open


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_model_config()).save_pretrained(directory)
    return directory


class HeldFirstStep:
    """Wraps the engine's real ``step``: records who is in the engine at each boundary and
    holds the first step until :attr:`release` is set."""

    def __init__(self, llm: LLMEngine) -> None:
        self.step = llm.step
        self.llm = llm
        self.boundaries: list[list[str]] = []
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self):
        self.boundaries.append(list(self.llm.requests))
        if len(self.boundaries) == 1:
            self.started.set()
            assert self.release.wait(10)
        return self.step()


def held_engine(model_dir) -> tuple[AsyncEngine, HeldFirstStep]:
    """An engine on the tiny model whose first step is held open."""
    config = EngineConfig(
        model=str(model_dir), device=ReferencePlatform(), dtype="float32", max_num_seqs=8,
        max_num_batched_tokens=64, max_model_len=128, kv_cache_bytes=1 << 20,
    )  # fmt: skip
    engine = AsyncEngine(lambda: LLMEngine(config, skip_tokenizer_init=True))
    held = HeldFirstStep(engine.engine)
    engine.engine.step = held
    return engine, held


def test_requests_admitted_during_a_step_enter_at_the_next_boundary_in_order(model_dir):
    engine, held = held_engine(model_dir)
    params = SamplingParams(temperature=0.0, max_tokens=4)

    async def run(request_id: str, prompt: list[int], arrival: float | None = None):
        stream = await engine.add_request(request_id, params, prompt_token_ids=prompt, arrival_time=arrival)
        return [out async for out in stream]

    async def scenario():
        first = asyncio.create_task(run("a", [1, 2, 3, 4, 5]))
        await asyncio.get_running_loop().run_in_executor(None, held.started.wait, 10)
        submitted = time.time()
        late = [asyncio.create_task(run(name, [7, 8, 9, i])) for i, name in enumerate("bcd")]
        # stamped by the HTTP layer before it reached the engine: kept, and sorted ahead of b, c, d
        stamped = asyncio.create_task(run("e", [3, 3, 3], arrival=submitted - 5.0))
        await asyncio.sleep(HELD_S)
        held.release.set()
        return submitted, await first, await asyncio.gather(*late, stamped)

    try:
        submitted, first, (b, c, d, e) = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert held.boundaries[0] == ["a"]
    assert held.boundaries[1] == ["a", "b", "c", "d", "e"]  # the next boundary, in the order they came
    for outs in (first, b, c, d, e):
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 4
    for outs in (b, c, d):
        m = outs[-1].metrics
        assert submitted <= m.arrival_time < submitted + HELD_S / 2  # stamped when added, not when taken in
        assert m.time_in_queue >= HELD_S * 0.9  # the held step counts as queue time
        assert m.first_token_time - m.arrival_time >= HELD_S * 0.9
    arrivals = [outs[-1].metrics.arrival_time for outs in (b, c, d)]
    assert arrivals == sorted(arrivals)
    assert e[-1].metrics.arrival_time == submitted - 5.0 and e[-1].metrics.time_in_queue >= 5.0
    engine.engine.block_manager.check_no_leaks()


def test_stats_count_a_request_once_while_the_engine_takes_it_in(model_dir):
    """``stats`` counts a request handed to ``add_request`` as waiting from the call on, and once only:
    while its command is queued behind a held step, and after the engine took it in and refreshed its
    snapshot but before the caller's coroutine resumed (a /metrics read then counted it twice: 21
    requests running + waiting of 16 sent, once under load)."""
    engine, held = held_engine(model_dir)
    params = SamplingParams(temperature=0.0, max_tokens=4)

    def counted() -> int:
        stats = engine.stats()
        return stats["num_running"] + stats["num_waiting"]

    async def run(request_id: str):
        stream = await engine.add_request(request_id, params, prompt_token_ids=[1, 2, 3])
        return [out async for out in stream]

    async def scenario():
        first = asyncio.create_task(run("a"))
        await asyncio.get_running_loop().run_in_executor(None, held.started.wait, 10)
        assert counted() == 1
        second = asyncio.create_task(run("b"))
        await asyncio.sleep(0)  # b's command queued behind the held step
        queued = counted()
        held.release.set()
        deadline = time.monotonic() + 10
        while len(held.boundaries) < 2 and time.monotonic() < deadline:  # the loop held: b's caller cannot resume
            time.sleep(0.001)
        taken_in = counted()
        return queued, taken_in, await first, await second

    try:
        queued, taken_in, first, second = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert held.boundaries[1] == ["a", "b"]
    assert (queued, taken_in) == (2, 2)
    assert first[-1].finished and second[-1].finished
    assert engine.stats()["num_waiting"] == 0
