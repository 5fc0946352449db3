"""The CUDA-graph runner's bookkeeping, off-GPU and on.

Off-GPU a stand-in "graph" re-runs the captured function on replay: like a real
graph it sees only what the static buffers hold, so replay equals eager only if the
runner pads into them correctly and the kernels read lengths from device tensors
(the Triton kernels under the interpreter here).
"""

from __future__ import annotations

import pytest
import torch
from plugin_cuda.platform import CudaPlatform
from plugin_cuda.runner import CudaGraphRunner, TorchCudaGraphs
from plugins.attention import AttentionMetadata
from plugins.gpu_triton.kernels import TritonKernels
from plugins.kernels import Kernels
from plugins.reference import engine_config as reference_engine_config
from plugins.runner import ModelInputs, Runner, pad_inputs

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_GPU else "cpu")
BLOCK_SIZE, MAX_MODEL_LEN = 4, 32


@pytest.fixture(autouse=True)
def inference_mode():
    """The engine runs every forward under inference mode; so do these tests."""
    with torch.inference_mode():
        yield


class Platform(CudaPlatform):
    def __init__(self, kernels) -> None:
        self._kernels = kernels

    @property
    def kernels(self):
        return self._kernels


def engine_config(**kw):
    return reference_engine_config(
        **{"max_num_seqs": 4, "max_model_len": MAX_MODEL_LEN, "block_size": BLOCK_SIZE, **kw}
    )


def decode_batch(seq_lens: list[int], num_blocks: int) -> ModelInputs:
    tables, start = [], 0
    for s in seq_lens:
        n = -(-s // BLOCK_SIZE)
        tables.append(list(range(start, start + n)))
        start += n
    assert start <= num_blocks
    meta = AttentionMetadata.build([1] * len(seq_lens), seq_lens, tables, BLOCK_SIZE, device=DEVICE)
    ids = torch.tensor([(7 * s) % 64 for s in seq_lens], device=DEVICE)
    return ModelInputs(ids, torch.tensor(seq_lens, device=DEVICE) - 1, meta)


def filled_caches(model, num_blocks: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    caches = model.new_kv_caches(num_blocks, BLOCK_SIZE)
    for k, v in caches:
        k.copy_(torch.randn(k.shape, generator=gen))
        v.copy_(torch.randn(v.shape, generator=gen))
    return caches


def assert_same_kv(caches, want_caches, slot_mapping: torch.Tensor, tol: float) -> None:
    """Padding wrote no KV slot: every slot outside ``slot_mapping`` is bit-equal; the
    batch's own slots may differ by rounding (a padded batch is a different matmul)."""
    for (k, v), (wk, wv) in zip(caches, want_caches, strict=True):
        k, v, wk, wv = (t.flatten(0, 1) for t in (k, v, wk, wv))
        untouched = torch.ones(k.shape[0], dtype=torch.bool, device=k.device)
        untouched[slot_mapping] = False
        assert torch.equal(k[untouched], wk[untouched]) and torch.equal(v[untouched], wv[untouched])
        torch.testing.assert_close((k, v), (wk, wv), atol=tol, rtol=tol)


def bound(model, caches) -> Runner:
    """The eager runner, bound to ``model`` and ``caches``."""
    runner = Runner(None)
    runner.prepare(model, caches, engine_config())
    return runner


def make_runner(kernels, monkeypatch, stand_in, sizes: str | None = "1,2,4"):
    if sizes is None:
        monkeypatch.delenv("CORE_CUDA_GRAPH_SIZES", raising=False)
    else:
        monkeypatch.setenv("CORE_CUDA_GRAPH_SIZES", sizes)
    fake = stand_in()
    return CudaGraphRunner(Platform(kernels), graphs=fake), fake


def test_replay_equals_eager_and_padding_is_cut(tiny_model, monkeypatch, replay_by_rerun) -> None:
    kernels = TritonKernels(ops_backend="reference", decode_split_tokens=16, num_sms=4)
    model = tiny_model(kernels)
    runner, fake = make_runner(kernels, monkeypatch, replay_by_rerun)
    caches = filled_caches(model, 24, seed=1)
    runner.prepare(model, caches, engine_config())
    assert runner.capture_sizes == (1, 2, 4) and fake.captured == [4, 2, 1]  # largest first
    for seq_lens in ([9], [30, 5, 17], [2, 20]):
        inputs = decode_batch(seq_lens, 24)
        eager_caches = [(k.clone(), v.clone()) for k, v in caches]
        want = bound(model, eager_caches).execute(inputs)
        before = fake.replays
        got = runner.execute(inputs)
        assert fake.replays == before + 1, "a decode batch within the captured sizes must replay"
        assert got.shape == want.shape == (len(seq_lens), 32)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert_same_kv(caches, eager_caches, inputs.attn_metadata.slot_mapping, 1e-5)


def test_prefill_larger_batches_and_foreign_caches_run_eagerly(tiny_model, monkeypatch, replay_by_rerun) -> None:
    kernels = TritonKernels(ops_backend="reference", decode_split_tokens=16, num_sms=4)
    model = tiny_model(kernels)
    runner, fake = make_runner(kernels, monkeypatch, replay_by_rerun, sizes="1,2")
    caches = filled_caches(model, 24, seed=2)
    runner.prepare(model, caches, engine_config())
    three = decode_batch([3, 4, 5], 24)
    assert runner.padded_num_seqs(three) is None  # above the largest captured size
    prefill = AttentionMetadata.build([3], [3], [[0]], BLOCK_SIZE, device=DEVICE)
    prefill_inputs = ModelInputs(torch.tensor([1, 2, 3], device=DEVICE), torch.arange(3, device=DEVICE), prefill)
    assert runner.padded_num_seqs(prefill_inputs) is None
    runner.execute(three)
    runner.execute(prefill_inputs)
    runner.profile(
        model, model.new_kv_caches(24, BLOCK_SIZE), decode_batch([3], 24)
    )  # the profile pass: its own caches
    assert fake.replays == 0


@pytest.mark.parametrize(
    "attention,cfg,reason",
    [("triton", {"enforce_eager": True}, "enforce_eager"), ("reference", {}, "not graph-safe")],
)
def test_no_capture_when_eager(attention, cfg, reason, tiny_model, monkeypatch, caplog, replay_by_rerun) -> None:
    kernels = TritonKernels(attention_backend=attention, ops_backend="reference")
    model = tiny_model(kernels)
    runner, fake = make_runner(kernels, monkeypatch, replay_by_rerun)
    with caplog.at_level("INFO"):
        runner.prepare(model, model.new_kv_caches(8, BLOCK_SIZE), engine_config(**cfg))
    assert fake.captured == [] and runner.capture_sizes == ()
    assert reason in caplog.text


def test_padding_equals_unpadded_on_reference_kernels(tiny_model) -> None:
    """pad_inputs semantics on the torch reference: padding rows change nothing."""
    model = tiny_model(Kernels())
    caches = filled_caches(model, 24, seed=3)
    inputs = decode_batch([9, 30, 2], 24)
    padded_caches = [(k.clone(), v.clone()) for k, v in caches]
    want = bound(model, caches).forward(inputs)
    got = bound(model, padded_caches).forward(pad_inputs(inputs, 8))
    torch.testing.assert_close(got[:3], want, atol=1e-6, rtol=1e-6)
    assert_same_kv(padded_caches, caches, inputs.attn_metadata.slot_mapping, 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_graph_replay_equals_eager_on_gpu(dtype, tiny_model, monkeypatch) -> None:
    monkeypatch.setenv("CORE_CUDA_GRAPH_SIZES", "1,2,4,8")
    kernels = TritonKernels()
    model = tiny_model(kernels, dtype)
    runner = CudaGraphRunner(Platform(kernels), graphs=TorchCudaGraphs())
    caches = filled_caches(model, 24, seed=4)
    runner.prepare(model, caches, engine_config(max_num_seqs=8))
    assert runner.graph_memory_bytes is not None
    for seq_lens in ([9], [30, 5, 17], [2, 20, 1, 3, 4, 8]):
        inputs = decode_batch(seq_lens, 24)
        eager_caches = [(k.clone(), v.clone()) for k, v in caches]
        want = bound(model, eager_caches).execute(inputs)
        got = runner.execute(inputs)
        torch.cuda.synchronize()
        tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        assert_same_kv(caches, eager_caches, inputs.attn_metadata.slot_mapping, tol)
