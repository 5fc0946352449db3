"""The shared-memory communicator (plugins.cpu_native.shm) and the fused decoder's all-reduce, two ranks at a time.

Each test starts two processes of shm_rank.py (one rank each) and compares what they saw:
sums and gathers through the shared buffer against torch, the gloo fallback for ranks on
different hosts, a rank that never arrives, and a tensor-parallel shard's fused decoder
against its eager forward. The kit's communicator check (test_platform.py) covers the
platform's communicator as the engine makes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from plugins.distributed import free_tcp_address
from plugins.reference import tiny_model_config

RANK_SCRIPT = Path(__file__).with_name("shm_rank.py")


def run_ranks(tmp_path: Path, case: str, *extra: str, timeout_s: float = 180) -> list[dict]:
    """Both ranks' results of ``case`` (each process pinned to one CPU where two are allowed)."""
    address, cpus = free_tcp_address(), sorted(os.sched_getaffinity(0))
    outs = [tmp_path / f"{case}{r}.pt" for r in range(2)]
    procs = [
        subprocess.Popen(
            [
                "taskset",
                "-c",
                str(cpus[r % len(cpus)]),
                sys.executable,
                str(RANK_SCRIPT),
                case,
                str(r),
                address,
                str(outs[r]),
                *extra,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    for r, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"rank {r} of {case!r} did not finish within {timeout_s} s") from None
        assert proc.returncode == 0, f"rank {r} of {case!r}: {err[-3000:]}"
    return [torch.load(out, weights_only=False) for out in outs]


def check_collectives(results: list[dict]) -> None:
    inputs = [r["inputs"] for r in results]
    for i in range(len(inputs[0])):
        x0, x1 = inputs[0][i], inputs[1][i]
        expected = (x0.float() + x1.float()).to(x0.dtype) if x0.is_floating_point() else x0 + x1
        for rank, r in enumerate(results):
            assert torch.equal(r["sums"][i], expected), f"sum {i} on rank {rank}"
            assert torch.equal(r["gathers"][i], torch.cat([x0, x1], dim=-1)), f"gather {i} on rank {rank}"
    for rank, r in enumerate(results):
        assert torch.equal(r["gathers"][-1], torch.cat([inputs[0][0], inputs[1][0]], dim=0)), (
            f"gather dim 0, rank {rank}"
        )
        assert torch.equal(r["view"], results[0]["sums"][0]), f"non-contiguous sum on rank {rank}"


def test_ranks_on_one_host_sum_and_gather_through_the_shared_buffer(tmp_path):
    results = run_ranks(tmp_path, "one_host")
    assert [(r["shared"], r["native"]) for r in results] == [(True, True)] * 2
    check_collectives(results)


def test_ranks_on_different_hosts_use_gloo(tmp_path):
    results = run_ranks(tmp_path, "hosts")
    assert [(r["shared"], r["native"]) for r in results] == [(False, False)] * 2
    check_collectives(results)


@pytest.mark.slow  # waits out a 3 s timeout
def test_a_rank_that_never_arrives_is_named_after_the_timeout(tmp_path):
    result = run_ranks(tmp_path, "timeout")[0]
    assert result["error"] is not None and "rank 1 did not reach it within 3 s" in result["error"]
    assert result["waited_s"] >= 2.9


def test_an_abort_ends_every_rank_s_wait_at_once(tmp_path):
    first, second = run_ranks(tmp_path, "abort")
    assert first["errors"] == ["all_reduce on rank 0: aborted waiting for rank 1"]
    assert first["waited_s"] < 10
    assert second["errors"] == ["all_reduce on rank 1: aborted waiting for rank 0"]
    assert second["waited_s"] < 10


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(tiny_model_config()).save_pretrained(path)
    return path


@pytest.mark.slow  # two processes load core and a model
def test_fused_decoder_of_a_shard_equals_its_eager_forward(tmp_path, tiny_llama):
    """The all-reduces inside the native layer loop (and the vocabulary-parallel embedding)
    give each rank exactly what the eager forward's Python all-reduces give it."""
    results = run_ranks(tmp_path, "fused", str(tiny_llama))
    for rank, r in enumerate(results):
        assert r["shared"]
        for step, (expected, actual) in enumerate(r["steps"]):
            assert torch.equal(actual, expected), f"rank {rank} step {step}: {(actual - expected).abs().max()}"
    for (h0, _), (h1, _) in zip(results[0]["steps"], results[1]["steps"], strict=True):
        assert torch.equal(h0, h1)  # the ranks' residual streams agree bit for bit


@pytest.mark.slow  # two engines, one with two worker processes
@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_tp2_engine_greedy_equals_tp1(tiny_llama, backend):
    """The engine's path: each worker's communicator from the platform, the fused decoder on both ranks."""
    from core import LLM, SamplingParams

    prompts = [[1, 5, 9, 200, 7], [3, 130, 64]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def greedy(**kwargs) -> list[list[int]]:
        llm = LLM(model=str(tiny_llama), device="cpu_x86", dtype="float32", skip_tokenizer_init=True,
                  max_model_len=128, kv_cache_bytes=1 << 22, **kwargs)  # fmt: skip
        try:
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        finally:
            llm.shutdown()
        return [o.outputs[0].token_ids for o in outs]

    expected = greedy()
    if backend == "mp":
        assert greedy(tensor_parallel_size=2) == expected
        return
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # the ranks are actors on one node
    try:
        assert greedy(tensor_parallel_size=2, distributed_executor_backend="ray") == expected
    finally:
        ray.shutdown()
