"""The XLA path on torch_xla's CPU device: tracing, compilation, compile counts, tokens.

Run by ``make test-xla`` (its own venv with torch 2.9.0 + torch_xla 2.9.0,
``PJRT_DEVICE=CPU CORE_TPU_ALLOW_CPU=1``); skipped elsewhere. Buckets are kept
small (a few graphs of a 2-layer model) because every new shape is a real compile.
"""

import os

import pytest

if os.environ.get("PJRT_DEVICE") != "CPU":
    pytest.skip("XLA tests run under `make test-xla` (PJRT_DEVICE=CPU)", allow_module_level=True)

import logging
import random

import torch
import torch_xla
from plugin_tpu.kernels import XlaKernels
from plugin_tpu.platform import TpuPlatform
from plugin_tpu.runner import compile_count, pad_to_host
from plugins.attention import AttentionMetadata
from plugins.kernels import Kernels
from plugins.reference import ReferencePlatform, tiny_model_config
from plugins.runner import ModelInputs

import core

VOCAB = 320
SMALL = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 128, "block_size": 16}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """The shared tiny random Llama (:func:`plugins.reference.tiny_model_config`) with a
    vocabulary of its own (320): the conformance kit's tiny Llama compiles the same logits
    graphs in this process, which would leave the warm-up nothing to compile."""
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_model_config(vocab_size=VOCAB))
    with torch.no_grad():  # larger than the default init so greedy tokens vary from step to step
        for param in model.parameters():
            param.normal_(0, 0.5 if param.dim() > 1 else 0.02).add_(1.0 if param.dim() == 1 else 0.0)
    model.save_pretrained(path)
    return str(path)


def test_padded_attention_matches_reference():
    """A mixed batch (prefill, decode, chunked prefill) padded to 64 tokens and 8 sequences."""
    gen = torch.Generator().manual_seed(0)
    block_size, kv_heads, heads, head_size, num_blocks = 16, 2, 6, 32, 24
    query_lens, seq_lens = [7, 1, 30, 1], [7, 100, 45, 33]
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, start = [], 0
    for n in seq_lens:
        tables.append(perm[start : start + -(-n // block_size)])
        start += len(tables[-1])
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size)
    tokens = meta.num_tokens
    caches = [torch.randn(num_blocks, block_size, kv_heads, head_size, generator=gen) for _ in range(2)]
    q, k, v = (torch.randn(tokens, h, head_size, generator=gen) for h in (heads, kv_heads, kv_heads))
    ref_caches = [c.clone() for c in caches]
    Kernels().write_kv_cache(k, v, *ref_caches, meta.slot_mapping)
    expected = Kernels().paged_attention(q, *ref_caches, meta, 0.2)

    dev = torch_xla.device()
    positions = torch.cat([torch.arange(s - n, s) for n, s in zip(query_lens, seq_lens, strict=True)])
    padded = pad_to_host(ModelInputs(torch.zeros(tokens, dtype=torch.int64), positions, meta), 64, 8, 8)
    xla_meta = type(padded)(**{f: (t.to(dev) if isinstance(t, torch.Tensor) else t) for f, t in vars(padded).items()})
    pad = torch.zeros(64 - tokens, 1, head_size)
    kernels, xla_caches = XlaKernels(), [c.to(dev) for c in caches]
    kernels.write_kv_cache(
        torch.cat([k, pad.expand(-1, kv_heads, -1)]).to(dev),
        torch.cat([v, pad.expand(-1, kv_heads, -1)]).to(dev),
        *xla_caches,
        xla_meta.slot_mapping,
    )
    padded_q = torch.cat([q, pad.expand(-1, heads, -1)]).to(dev)
    got = kernels.paged_attention(padded_q, *xla_caches, xla_meta, 0.2)
    torch.testing.assert_close(got.cpu()[:tokens], expected, atol=1e-5, rtol=1e-5)
    # the Pallas path's arguments (page layout, padded per-sequence tensors) through the kernel's torch reference
    ragged = kernels.ragged_attention(padded_q, *xla_caches, xla_meta, 0.2, use_kernel=False)
    torch.testing.assert_close(ragged.cpu()[:tokens], expected, atol=1e-5, rtol=1e-5)
    for mine, ref in zip(xla_caches, ref_caches, strict=True):  # padding (slot -1) wrote nothing
        torch.testing.assert_close(mine.cpu(), ref)


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 60))] for _ in range(count)]


def _generate(llm, prompts, max_tokens):
    params = [core.SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_warm_up_compiles_each_shape_once_and_serving_compiles_nothing(tiny_llama, caplog):
    """Greedy tokens equal the reference platform's; warm-up compiles one graph per new
    shape; a burst of 32 mixed-length requests afterwards compiles none; a compile after
    the warm-up is logged."""
    platform = TpuPlatform()
    tpu = core.LLM(model=tiny_llama, device=platform, dtype="float32", skip_tokenizer_init=True, seed=0, **SMALL)
    runner = platform.runner
    assert runner.token_sizes == [16, 32, 64] and runner.seq_sizes == [8]
    assert runner.warm_up_compiles == {shape: 1 for shape in runner.warm_up_compiles}, runner.warm_up_compiles
    assert len(runner.warm_up_compiles) == 6  # 3 forward graphs (token sizes) + 3 logits graphs (x 1 row size)

    prompts = _prompts(32, seed=1)
    max_tokens = [random.Random(i).randint(1, 24) for i in range(32)]
    before = compile_count()
    got = _generate(tpu, prompts, max_tokens)
    assert compile_count() - before == 0, "a graph was compiled while serving"
    assert tpu.engine.stats()["platform"] == {"xla_compilations": compile_count()}
    with caplog.at_level(logging.WARNING, logger="plugin_tpu.runner"):
        (torch.ones(5).to(torch_xla.device()) * 3).cpu()  # a graph of a shape no step has: a compile
        _generate(tpu, [[1, 2]], [1])
    assert "XLA compiled 1 graph(s) while serving (forward of 16 tokens)" in caplog.text
    tpu.shutdown()

    ref = core.LLM(
        model=tiny_llama, device=ReferencePlatform(), dtype="float32", skip_tokenizer_init=True, seed=0, **SMALL
    )
    expected = _generate(ref, prompts, max_tokens)
    ref.shutdown()
    assert got == expected


def test_default_model_greedy_matches_reference():
    """The default model (SmolLM2-135M, GGUF) on XLA:CPU against the reference platform."""
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
    params = core.SamplingParams(temperature=0.0, max_tokens=8)

    def run(device):
        llm = core.LLM(device=device, dtype="float32", seed=0, **SMALL)
        outs = llm.generate(prompts, params, use_tqdm=False)
        llm.shutdown()
        return [o.outputs[0].token_ids for o in outs]

    assert run(TpuPlatform()) == run(ReferencePlatform())
