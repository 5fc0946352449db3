"""Host work of plugin_cuda's steps, measured on the CPU (issue 43, deliverable 1).

The engine runs the CUDA platform's runner code path (CUDA-graph capture and replay, the
platform's token budget, pinned staging) on the CPU: the graph API is a stand-in that re-runs
the captured forward on replay, the kernels are the SDK's torch reference marked graph-safe
(the Triton kernels are not executed). Per engine step it counts what would cost host time on
a GPU: kernel launches outside graphs (every aten op that is not a view), staged host-to-device
copies (``Runner.stage``), host-to-device copies that synchronise (``torch.tensor(..., device=)``,
``.to(device)`` of host data) and device reads (``.tolist()``, ``.item()``, ``.cpu()``: the host
waits for the GPU). ``python bench/cuda_vs_transformers.py --part profile`` measures the same on a GPU.
"""

from __future__ import annotations

import pytest
import torch
from plugin_cuda.platform import CudaPlatform
from plugin_cuda.runner import CudaGraphRunner
from plugins.kernels import Kernels
from plugins.memory import MemoryProfiler
from plugins.reference import TINY_MODEL
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from core import LLM, SamplingParams

#: aten ops that launch no kernel (views, metadata, allocation)
NO_LAUNCH = {"view", "_unsafe_view", "reshape", "slice", "select", "as_strided", "t", "transpose", "expand",
             "unsqueeze", "squeeze", "split", "split_with_sizes", "detach", "alias", "empty", "empty_strided",
             "empty_like", "permute", "unbind", "chunk", "narrow", "lift_fresh", "_reshape_alias", "unfold"}  # fmt: skip
READS = {"tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}


class Counts(TorchDispatchMode):
    """Aten ops dispatched outside graph replay, per engine step."""

    def __init__(self) -> None:
        super().__init__()
        self.launches = 0
        self.in_replay = False
        self.inside = False  # in a stood-in kernel, which counts as one launch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (self.in_replay or self.inside) and func.overloadpacket.__name__ not in NO_LAUNCH:
            self.launches += 1
        return func(*args, **(kwargs or {}))


class Syncs(TorchFunctionMode):
    """Device reads and synchronising host-to-device copies."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.sync_copies = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS:
            self.reads += 1
        elif name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            self.sync_copies += 1
        elif name == "to" and args and isinstance(args[0], torch.Tensor) and not kwargs.get("non_blocking"):
            if any(isinstance(a, (str, torch.device)) for a in args[1:]) or "device" in kwargs:
                self.sync_copies += 1
        return func(*args, **kwargs)


class CountedReplay:
    """conftest's graph stand-in (replay re-runs the captured forward); a replay counts as one
    launch (cudaGraphLaunch), the ops it re-runs as none."""

    def __init__(self, stand_in, counts: Counts) -> None:
        self.inner = stand_in()
        self.counts = counts

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def replay(self, graph) -> None:
        self.counts.launches += 1
        self.counts.in_replay = True
        try:
            self.inner.replay(graph)
        finally:
            self.counts.in_replay = False


#: the ops plugin_cuda runs as one Triton kernel (or one cuBLAS call) each
ONE_LAUNCH_OPS = ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul", "write_kv_cache",
                  "paged_attention", "linear", "apply_token_bitmask")  # fmt: skip


class GraphSafeReference(Kernels):
    """The torch reference standing in for the Triton kernels (not executed here): each op of
    :data:`ONE_LAUNCH_OPS` counts as one launch, whatever torch ops the reference runs for it."""

    is_graph_safe = True

    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts = counts

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if name not in ONE_LAUNCH_OPS:
            return attr
        counts = super().__getattribute__("counts")

        def one_launch(*args, **kwargs):
            if counts.inside or counts.in_replay:
                return attr(*args, **kwargs)
            counts.launches += 1
            counts.inside = True
            try:
                return attr(*args, **kwargs)
            finally:
                counts.inside = False

        return one_launch


class CpuStandInCuda(CudaPlatform):
    """plugin_cuda's platform with its device calls stood in, on the CPU."""

    def __init__(self, counts: Counts, stand_in) -> None:
        self.counts = counts
        self.graphs = CountedReplay(stand_in, counts)
        self.staged = 0

    def unavailable_reason(self):
        return None

    def check_config(self, config):
        return {}

    def init_device(self, config) -> None:
        pass

    def torch_device(self):
        return torch.device("cpu")

    def synchronize(self) -> None:
        pass

    def make_kernels(self):
        return GraphSafeReference(self.counts)

    def make_memory_profiler(self):
        return MemoryProfiler(self)

    def make_runner(self):
        runner = CudaGraphRunner(self, graphs=self.graphs)
        stage = runner.stage

        def counted(host):
            self.staged += 1
            return stage(host)

        runner.stage = counted
        return runner


@pytest.fixture(scope="module")
def engine(tmp_path_factory, replay_by_rerun):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("tiny_qwen2")
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**{**TINY_MODEL, "max_position_embeddings": 1024})).save_pretrained(folder)
    counts = Counts()
    plat = CpuStandInCuda(counts, replay_by_rerun)
    llm = LLM(model=str(folder), device=plat, dtype="float32", skip_tokenizer_init=True, enable_prefix_caching=False,
              max_num_seqs=8, max_model_len=512, seed=0)  # fmt: skip
    yield llm, plat, counts
    llm.shutdown()


def _per_step(engine, prompts, max_tokens):
    """Counts per engine step over one ``generate`` (steps after the first decode only when
    ``max_tokens`` > 1: the prefill step is measured with ``max_tokens=1``)."""
    llm, plat, counts = engine
    llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                 use_tqdm=False)  # warm-up  # fmt: skip
    steps, syncs, step = [0], Syncs(), llm.engine.step
    counts.launches, plat.staged = 0, 0

    def counted_step():
        steps[0] += 1
        return step()

    llm.engine.step = counted_step
    try:
        with counts, syncs:
            llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                         use_tqdm=False)  # fmt: skip
    finally:
        llm.engine.step = step
    n = steps[0]
    print(f"{len(prompts)} prompts, {max_tokens} tokens: {n} steps; per step {counts.launches / n:.1f} launches, "
          f"{plat.staged / n:.2f} staged copies, {syncs.sync_copies / n:.2f} synchronising copies, "
          f"{syncs.reads / n:.2f} device reads")  # fmt: skip
    return n, counts.launches / n, plat.staged / n, syncs.sync_copies / n, syncs.reads / n


def test_prefill_step_of_2048_tokens(engine):
    """8 prompts of 256 tokens (random sampling): one step (the platform's 8192-token budget),
    three staged copies, no synchronising copy, one device read (the sampled tokens). Launches: the eager
    forward's ops (prefill graphs are not built yet; the budget holds today's count)."""
    prompts = [[(7 * i + j) % 250 + 1 for j in range(256)] for i in range(8)]
    steps, launches, staged, sync_copies, reads = _per_step(engine, prompts, 1)
    layers = TINY_MODEL["num_hidden_layers"]
    assert steps == 1
    assert staged <= 3, "one staged copy each: the inputs, the sampled rows' index, the temperatures"
    assert sync_copies == 0
    assert reads <= 1
    assert launches <= 14 * layers + 20, f"{launches} launches for {layers} layers"


def test_decode_steps_replay_graphs_without_synchronising_copies(engine):
    """8 sequences decoding: each step one graph replay, one staged copy, no synchronising copy,
    one device read, and a few launches outside the graph (input copies, logits, sampling)."""
    llm, plat, counts = engine
    prompts = [[i + 1, i + 2, i + 3] for i in range(8)]
    replays = plat.graphs.replays
    steps, launches, staged, sync_copies, reads = _per_step(engine, prompts, 17)
    decode_steps = steps - 1
    assert plat.graphs.replays - replays >= 2 * decode_steps  # the warm-up's and the measured run's
    assert staged <= 2 + 1 / steps  # the inputs and the temperatures; the prefill step also its sampled rows
    assert sync_copies == 0
    assert reads <= 1
    assert launches <= 30, f"{launches:.1f} launches a step outside the graph"
