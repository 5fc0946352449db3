"""The bucketed runner on CPU tensors: padding gives eager's result, warm-up covers every bucket."""

import pytest
import torch
from plugin_hpu.platform import HpuPlatform
from plugin_hpu.runner import HpuRunner, dummy_inputs, pad_block_tables
from plugins.attention import AttentionMetadata
from plugins.kernels import Kernels
from plugins.runner import ModelInputs, Runner


class CpuHpuPlatform(HpuPlatform):
    """The HPU platform's runner logic on CPU tensors."""

    device_type = "cpu"

    def synchronize(self) -> None:
        pass


class TinyModel:
    """Embedding -> K/V write -> paged attention: records the shapes it is called with."""

    def __init__(self, heads=2, head_size=16):
        gen = torch.Generator().manual_seed(0)
        self.kernels = Kernels()
        self.embed = torch.randn(64, 3 * heads * head_size, generator=gen)
        self.heads, self.head_size = heads, head_size
        self.calls = []

    def __call__(self, input_ids, positions, kv_caches, meta):
        self.calls.append((meta.num_seqs, tuple(meta.block_tables.shape), input_ids.shape[0]))
        q, k, v = self.embed[input_ids].view(-1, 3, self.heads, self.head_size).unbind(1)
        k_cache, v_cache = kv_caches[0]
        self.kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        return self.kernels.paged_attention(q.contiguous(), k_cache, v_cache, meta, self.head_size**-0.5).flatten(1)


class Config:
    block_size = 16
    max_num_seqs = 4
    max_model_len = 64
    max_num_batched_tokens = 256
    enforce_eager = False


def caches(num_blocks=40):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(num_blocks, 16, 2, 16, generator=gen), torch.randn(num_blocks, 16, 2, 16, generator=gen))]


def decode_batch(seq_lens, tables):
    meta = AttentionMetadata.build([1] * len(seq_lens), seq_lens, tables, 16)
    ids = torch.arange(len(seq_lens)) + 3
    return ModelInputs(ids, torch.tensor(seq_lens) - 1, meta)


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setenv("CORE_SKIP_WARMUP", "1")
    runner = HpuRunner(CpuHpuPlatform())
    runner.prepare(TinyModel(), caches(), Config())
    return runner


def test_buckets_from_config(runner):
    assert runner.buckets.ranges["DECODE_BS"].values() == [1, 2, 4]
    assert runner.buckets.ranges["DECODE_BLOCK"].values() == list(range(16, 129, 16))  # max(128, 4 * 64 / 16)
    # the cache holds 40 blocks: buckets with more are never reached
    assert runner.buckets.decode == [(1, 16), (1, 32), (2, 16), (2, 32), (4, 16), (4, 32)]


def test_padded_decode_equals_eager(runner):
    inputs = decode_batch([17, 3, 40], [[5, 9], [2], [7, 8, 11]])
    model = TinyModel()
    eager_caches, padded_caches = caches(), caches()
    eager_runner = Runner(runner.platform)
    eager_runner.prepare(model, eager_caches, Config())
    eager = eager_runner.execute(inputs)
    runner.prepare(model, padded_caches, Config())
    padded = runner.execute(inputs)
    assert model.calls[-1] == (4, (4, 4), 4)  # bucket (4, 16): 4 sequences, 16 / 4 = 4 table columns
    torch.testing.assert_close(padded, eager)
    torch.testing.assert_close(padded_caches[0][0], eager_caches[0][0])


def test_prompt_runs_unpadded(runner):
    meta = AttentionMetadata.build([5], [5], [[3]], 16)
    inputs = ModelInputs(torch.arange(5), torch.arange(5), meta)
    assert runner.padded_num_seqs(inputs) is None
    assert runner.execute(inputs).shape == (5, 32)


def test_block_table_padding_only_widens():
    inputs = decode_batch([40], [[1, 2, 3]])
    assert pad_block_tables(inputs, 5).attn_metadata.block_tables.tolist() == [[1, 2, 3, 0, 0]]
    assert pad_block_tables(inputs, 2) is inputs


def test_warmup_runs_every_bucket_without_writing_the_cache(monkeypatch):
    monkeypatch.delenv("CORE_SKIP_WARMUP", raising=False)
    model, kv = TinyModel(), caches()
    before = kv[0][0].clone()
    runner = HpuRunner(CpuHpuPlatform())
    runner.prepare(model, kv, Config())
    num_prompt, num_decode = len(runner.buckets.prompt), len(runner.buckets.decode)
    assert len(model.calls) == num_prompt + num_decode
    assert model.calls[0][0] == 4 and model.calls[-1][0] == 1  # largest first
    torch.testing.assert_close(kv[0][0], before)


def test_dummy_inputs_shapes():
    prompt = dummy_inputs((2, 32), True, 16, "cpu")
    assert prompt.num_tokens == 64 and prompt.attn_metadata.block_tables.shape == (2, 2)
    decode = dummy_inputs((4, 16), False, 16, "cpu")
    assert decode.num_tokens == 4 and decode.attn_metadata.block_tables.shape == (4, 4)
    assert (decode.attn_metadata.slot_mapping == -1).all()
