"""The bucketed runner on CPU tensors: padding gives eager's result, warm-up covers every bucket,
and the HPU graphs it captures are those the graph memory holds (a fake Gaudi measures them)."""

import dataclasses

import pytest
import torch
from plugin_hpu.platform import HpuMemoryProfiler, HpuPlatform
from plugin_hpu.runner import HpuRunner, dummy_inputs, hpu_graph_wrapper, pad_block_tables
from plugins.attention import AttentionMetadata
from plugins.kernels import Kernels
from plugins.memory import GiB, MiB
from plugins.reference import engine_config
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


class FakeGaudi:
    """torch.hpu's memory API and HPU graphs as a Gaudi behaves: the first call of a
    graph at a new input shape captures it and takes 1 MiB per token from free memory;
    later calls replay it for free."""

    def __init__(self, free: int) -> None:
        self.free, self.total = free, 8 * GiB
        self.shapes: set = set()
        self.replays: list = []

    def mem_get_info(self) -> tuple[int, int]:
        return self.free, self.total

    def synchronize(self) -> None:
        pass

    def wrap(self, model):
        def graphed(input_ids, positions, kv_caches, meta):
            shape = (tuple(input_ids.shape), tuple(meta.block_tables.shape))
            if shape not in self.shapes:
                self.shapes.add(shape)
                self.free -= input_ids.shape[0] * MiB
            self.replays.append(shape)
            return model(input_ids, positions, kv_caches, meta)

        return graphed


class GaudiLikePlatform(CpuHpuPlatform):
    """The HPU platform with its memory API on a FakeGaudi."""

    def __init__(self, device: FakeGaudi) -> None:
        self.device = device

    def make_memory_profiler(self):
        return HpuMemoryProfiler(self, device=self.device)


GRAPH_CONFIG = engine_config(block_size=16, max_num_seqs=4, max_model_len=64, max_num_batched_tokens=256,
                             gpu_memory_utilization=0.8)  # fmt: skip


def graphed_runner(monkeypatch, **env):
    """Profile (4000 MiB free), allocate the planned KV cache, then prepare: what the engine does."""
    for name, value in {"GRAPH_RESERVED_MEM": "0.125", "GRAPH_PROMPT_RATIO": "0.5", **env}.items():
        monkeypatch.setenv(f"CORE_{name}", value)
    device = FakeGaudi(4000 * MiB)
    platform = GaudiLikePlatform(device)
    plan = platform.memory.plan_kv_cache(GRAPH_CONFIG, block_bytes=MiB)
    device.free -= plan.num_blocks * MiB  # the KV cache's allocation
    runner = HpuRunner(platform, graph_wrapper=device.wrap)
    runner.prepare(TinyModel(), caches(), GRAPH_CONFIG)
    return runner, device, plan


def test_graphs_captured_within_the_reserved_memory(monkeypatch):
    runner, device, plan = graphed_runner(monkeypatch)
    # 4000 MiB free: 80% usable = 3200 MiB, of which 12.5% (400 MiB) for graphs, 2800 MiB KV; 800 MiB margin
    assert plan.num_blocks == 2800 and platform_margin(runner) == 800 * MiB
    prompt, decode = runner.captured
    # 400 MiB after warm-up, 200 MiB per phase. Prompt graphs cost 1 MiB per token, in min_tokens order
    # 16, 32, 32, 48, 64 (= 192 MiB) fit; the next 64-token ones do not. Decode's six (max_bs) cost 14 MiB;
    # its 186 MiB left over go back to prompt: (2, 32) and (1, 64) fit, 96 tokens and more do not.
    assert prompt.captured == [(1, 16), (2, 16), (1, 32), (1, 48), (4, 16), (2, 32), (1, 64)]
    assert prompt.used_bytes == 320 * MiB and not prompt.captured_all
    assert decode.captured == [(4, 16), (4, 32), (2, 16), (2, 32), (1, 16), (1, 32)] and decode.used_bytes == 14 * MiB
    assert device.free == (1200 - 334) * MiB  # the margin was never touched
    assert len(device.shapes) == 13 and len(runner.graphed) == 13


def platform_margin(runner) -> int:
    return runner.platform.memory.plan.margin_bytes


def test_graphed_buckets_replay_and_the_rest_run_eagerly(monkeypatch):
    runner, device, _ = graphed_runner(monkeypatch)
    eager = Runner(runner.platform)
    eager.prepare(runner.model, caches(), GRAPH_CONFIG)
    replays = len(device.replays)
    decode = decode_batch([17, 3, 40], [[5, 9], [2], [7, 8, 11]])  # bucket (4, 16): graphed
    torch.testing.assert_close(runner.execute(decode), eager.execute(decode))
    assert len(device.replays) == replays + 1
    graphed_prompt = ModelInputs(torch.arange(64) % 60, torch.arange(32).repeat(2), AttentionMetadata.build([32, 32], [32, 32], [[1, 2], [3, 4]], 16))  # fmt: skip
    torch.testing.assert_close(runner.execute(graphed_prompt), eager.execute(graphed_prompt))
    assert len(device.replays) == replays + 2
    skipped = ModelInputs(torch.arange(96) % 60, torch.arange(48).repeat(2), AttentionMetadata.build([48, 48], [48, 48], [[1, 2, 3], [4, 5, 6]], 16))  # fmt: skip
    torch.testing.assert_close(runner.execute(skipped), eager.execute(skipped))  # (2, 48) did not fit: eager
    assert len(device.replays) == replays + 2
    free = device.free
    runner.execute(decode_batch([5], [[1]]))  # bucket (1, 16), graphed: a replay costs nothing
    assert device.free == free


def test_skip_warmup_graphs_each_bucket_on_first_use(monkeypatch):
    runner, device, _ = graphed_runner(monkeypatch, SKIP_WARMUP="1")
    assert runner.captured is None and not device.shapes
    runner.execute(decode_batch([17, 3, 40], [[5, 9], [2], [7, 8, 11]]))
    assert len(device.shapes) == 1 and runner.uses_graph((4, 16), False)


def test_enforce_eager_captures_nothing(monkeypatch):
    for name, value in {"GRAPH_RESERVED_MEM": "0.125", "SKIP_WARMUP": "0"}.items():
        monkeypatch.setenv(f"CORE_{name}", value)
    device = FakeGaudi(4000 * MiB)
    runner = HpuRunner(GaudiLikePlatform(device), graph_wrapper=device.wrap)
    config = dataclasses.replace(GRAPH_CONFIG, enforce_eager=True)
    runner.prepare(TinyModel(), caches(), config)
    assert runner.captured is None and not device.shapes and device.free == 4000 * MiB
    assert runner.platform.memory.plan_kv_cache(config, MiB).num_blocks == 3200  # nothing reserved for graphs


def test_device_graph_wrapper():
    pytest.importorskip("habana_frameworks", reason="needs the Intel Gaudi software stack (habana_frameworks)")
    graphed = hpu_graph_wrapper(torch.nn.Linear(4, 4))
    assert isinstance(graphed, torch.nn.Module)
