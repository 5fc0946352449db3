"""The fused native decoder runs one pipeline stage: the first embeds and hands over its hidden
states and residual, the last takes them and normalizes; chained, the stages' fused passes give
the whole model's eager hidden states and KV caches exactly."""

from __future__ import annotations

import pytest
import torch
import transformers
from plugin_cpu_x86.platform import CpuX86Platform
from plugins.attention import AttentionMetadata
from plugins.cpu_native.runner import FusedDecoder
from plugins.reference import tiny_model_config
from plugins.runner import ModelInputs

core_loader = pytest.importorskip("core.loader.loader", reason="the fused decoder runs core's models")
pipeline = pytest.importorskip("core.partition.pipeline")

BLOCK = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = tiny_model_config(transformers.LlamaConfig, vocab_size=128, num_hidden_layers=3)
    path = tmp_path_factory.mktemp("llama3layers")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def load(path, quantization, stage=None):
    kernels = CpuX86Platform().kernels
    loaded = core_loader.load_model(str(path), kernels=kernels, dtype=torch.float32, device=torch.device("cpu"),
                                    quantization=quantization, skip_tokenizer_init=True, stage=stage)  # fmt: skip
    return kernels, loaded.model


def caches(model):
    shape = (16, BLOCK, model.num_kv_heads, model.head_size)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in model.layers]


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_fused_stages_chained_equal_the_eager_whole_model(model_dir, quantization):
    _, whole = load(model_dir, quantization)
    stages = [load(model_dir, quantization, pipeline.PipelineStage.build(3, r, 2)) for r in range(2)]
    assert [m.num_layers for _, m in stages] == [2, 1]
    whole_caches, stage_caches = caches(whole), [caches(m) for _, m in stages]
    fused = [FusedDecoder(m.describe(c), k) for (k, m), c in zip(stages, stage_caches, strict=True)]
    tables, seq_lens = [[3, 0, 7], [1, 2, 4]], [0, 0]
    with torch.inference_mode():
        for new_tokens in ([[5, 9, 2, 1, 1], [7]], [[4], [8]], [[6], [3]]):  # prompts, then two decode steps
            totals = [n + len(t) for t, n in zip(new_tokens, seq_lens, strict=True)]
            positions = [p for t, n in zip(new_tokens, seq_lens, strict=True) for p in range(n, n + len(t))]
            meta = AttentionMetadata.build([len(t) for t in new_tokens], totals, tables, BLOCK, torch.device("cpu"))
            ids = torch.tensor([t for toks in new_tokens for t in toks])
            inputs = ModelInputs(ids, torch.tensor(positions), meta)
            expected = whole(ids, inputs.positions, whole_caches, meta)
            assert fused[0].can_run(inputs) and not fused[1].can_run(inputs)
            handed = fused[0](inputs)
            assert handed.shape == (len(ids), 2 * whole.config.hidden_size)
            later = ModelInputs(ids, inputs.positions, meta, intermediate=handed)
            assert fused[1].can_run(later) and not fused[0].can_run(later)
            assert torch.equal(fused[1](later), expected)
            seq_lens = totals
    for (k, v), (sk, sv) in zip(whole_caches, stage_caches[0] + stage_caches[1], strict=True):
        assert torch.equal(k, sk) and torch.equal(v, sv)
