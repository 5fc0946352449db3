"""The kit's checks of a platform's runtime parts: memory profiler, runner, communicator, generation."""

from __future__ import annotations

from typing import Any

import pytest
from plugins.reference import ReferencePlatform, engine_config, tiny_model_config
from plugins.testing.base import ConformanceBase


def first_difference(name: str, device: list[list[int]], reference: list[list[int]]) -> str | None:
    """Where platform ``name``'s generated token lists first differ from the reference's; None if equal."""
    for i, (got, want) in enumerate(zip(device, reference, strict=True)):
        if got == want:
            continue
        step = next((s for s, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        chose = [str(tokens[step]) if step < len(tokens) else "(nothing)" for tokens in (got, want)]
        return (
            f"prompt {i}: {name} and the reference platform first differ at generated token {step} "
            f"({name} chose {chose[0]}, the reference {chose[1]}); {name}: {got}; reference: {want}"
        )
    return None


#: the KV geometry of the default model of ``core serve`` (SmolLM2-135M-Instruct): layers,
#: KV heads, head size, and its context length, the default ``max_model_len``
DEFAULT_MODEL_KV = (30, 3, 64, 8192)


class RuntimeChecks(ConformanceBase):
    """The memory profiler, the runner (padded equals eager), the communicator and greedy generation."""

    def _default_platform(self, device_plat, monkeypatch) -> Any:
        """A fresh platform with none of its variables set (the default settings), or, when a
        variable is what makes the platform available on this machine at all (tpu's
        ``TPU_ALLOW_CPU`` on XLA:CPU), the platform as the tests run it."""
        if not isinstance(self.platform, type):
            return device_plat
        with monkeypatch.context() as probe:
            for var in device_plat.env_vars:
                probe.delenv(var.env_name, raising=False)
                probe.delenv(var.fallback_name, raising=False)
            available = type(device_plat)().is_available()
        if not available:
            return device_plat
        for var in device_plat.env_vars:  # unset until the test ends
            monkeypatch.delenv(var.env_name, raising=False)
            monkeypatch.delenv(var.fallback_name, raising=False)
        return type(device_plat)()

    def test_memory_budget_holds_one_max_model_len_sequence(self, device_plat, monkeypatch) -> None:
        """At the default settings (no variable, no ``--kv-cache-memory``, ``--dtype auto``) the KV
        budget holds one ``max_model_len`` sequence of the default model (in the platform's KV cache
        layout): else the engine refuses to start."""
        from plugins.config import EngineSettings

        plat = self._default_platform(device_plat, monkeypatch)
        layers, kv_heads, head_size, max_model_len = DEFAULT_MODEL_KV
        dtype, block_size = plat.supported_dtypes[0], EngineSettings.block_size
        config = engine_config(
            device=plat.name, dtype=dtype, kv_cache_dtype=dtype, max_model_len=max_model_len,
            max_num_seqs=EngineSettings.max_num_seqs, max_num_batched_tokens=2048,
        )  # fmt: skip
        block_bytes = layers * plat.kv_cache_layout(config, kv_heads, head_size).block_bytes
        plan = plat.memory.plan_kv_cache(config, block_bytes, peak_activation_bytes=0)
        needed = -(-max_model_len // block_size)
        assert plan.num_blocks >= needed, (
            f"memory profiler at the default settings: {plan.detail}, {plan.num_blocks * block_size} tokens, but one "
            f"sequence of max_model_len={max_model_len} of the default model ({layers} layers, {kv_heads} KV heads "
            f"of {head_size}, {dtype}) needs {needed} blocks: the engine would refuse to start"
        )

    def test_memory_profiler_honours_kv_cache_bytes(self, device_plat, monkeypatch) -> None:
        """An explicit ``--kv-cache-memory`` (``config.kv_cache_bytes``) is the budget, whatever the device has."""
        plat = self._default_platform(device_plat, monkeypatch)
        for requested in (48 << 20, 80 << 20):
            config = engine_config(device=plat.name, dtype=plat.supported_dtypes[0], kv_cache_bytes=requested)
            budget, why = plat.memory.kv_cache_budget(config, 0)
            assert budget == requested, (
                f"memory profiler: --kv-cache-memory asked {requested} bytes (config.kv_cache_bytes) but "
                f"kv_cache_budget returned {budget} ({why}): an explicit request must win"
            )

    def test_memory_profiler(self, device_plat) -> None:
        from plugins.memory import KVCachePlan

        mem = device_plat.memory
        total, free = mem.total_memory(), mem.free_memory()
        assert total > 0 and 0 <= free <= total, f"total={total} free={free}"
        assert mem.measure_peak(lambda: None) >= 0
        assert isinstance(mem.needs_profile_run, bool), "MemoryProfiler.needs_profile_run must be a bool"

        config = engine_config(kv_cache_bytes=64 << 20, gpu_memory_utilization=0.5)
        plan = mem.plan_kv_cache(config, block_bytes=1 << 20, peak_activation_bytes=0)
        assert isinstance(plan, KVCachePlan) and plan.num_blocks >= 0 and plan.detail
        assert plan.num_blocks * plan.block_bytes <= max(plan.budget_bytes, 0)
        import torch

        dtype, dev = getattr(torch, device_plat.supported_dtypes[0]), device_plat.torch_device()
        cache = mem.allocate_kv_cache((3, 16, 2, 8), dtype, dev)
        assert cache.shape == (3, 16, 2, 8) and cache.dtype == dtype and cache.device.type == dev.type

    def test_runner_padding_equals_eager(self, device_plat, gen) -> None:
        import torch
        from plugins.runner import ModelInputs, Runner, pad_inputs

        dtype_name = device_plat.supported_dtypes[0]
        dev = device_plat.torch_device()
        model = _TinyAttentionModel(device_plat.kernels, dtype_name, dev, gen)
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, [1, 1, 1], [9, 30, 2], 2, 32, 16)
        ids = torch.randint(0, 100, (3,), generator=gen).to(dev)
        inputs = ModelInputs(ids, torch.tensor(meta.seq_lens_host, device=dev) - 1, meta)
        config = engine_config(device=device_plat.name, dtype=dtype_name, max_num_seqs=8, block_size=16)
        caches = [(k_cache.clone(), v_cache.clone())]
        eager_runner = Runner(device_plat)
        eager_runner.prepare(model, caches, config)
        eager = eager_runner.execute(inputs)
        padded_caches = [(k_cache.clone(), v_cache.clone())]
        runner = device_plat.make_runner()
        runner.prepare(model, padded_caches, config)
        padded = runner.forward(pad_inputs(inputs, 8))[:3]
        self._assert_close(padded, eager, dtype_name, "padded forward vs eager")
        self._assert_close(padded_caches[0][0], caches[0][0], dtype_name, "KV cache after padded forward")

    def test_speculative_step_paged_attention_equals_plain_steps(self, device_plat, gen) -> None:
        """A speculative decoding step (decode rows of several tokens: a sequence's last token and
        its drafts, beside a one-token row) through the platform's runner equals feeding the same
        tokens one a step (decode-only steps, padded to the runner's sizes): hidden states of
        every token and the KV cache after."""
        import torch
        from plugins.attention import AttentionMetadata
        from plugins.runner import ModelInputs

        dtype_name = device_plat.supported_dtypes[0]
        dev = device_plat.torch_device()
        model = _TinyAttentionModel(device_plat.kernels, dtype_name, dev, gen)
        contexts, runs = [9, 29, 2], [4, 1, 3]  # KV already computed; tokens this step (last + drafts)
        final = [c + r for c, r in zip(contexts, runs, strict=True)]
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, runs, final, 2, 32, 16)
        tables = [meta.block_tables[i, : -(-n // 16)].tolist() for i, n in enumerate(final)]
        tokens = [torch.randint(0, 100, (r,), generator=gen).tolist() for r in runs]
        config = engine_config(device=device_plat.name, dtype=dtype_name, max_num_seqs=8, block_size=16)

        def execute(rows):  # (sequence, first position, tokens): one step on the bound runner
            step = AttentionMetadata.build(
                [len(t) for _, _, t in rows], [p + len(t) for _, p, t in rows], [tables[i] for i, _, _ in rows],
                16, device=dev,
            )  # fmt: skip
            ids = torch.tensor([x for _, _, t in rows for x in t], device=dev)
            positions = torch.tensor([p + j for _, p, t in rows for j in range(len(t))], device=dev)
            with runner.grad_mode():
                return runner.execute(ModelInputs(ids, positions, step)).clone()

        spec_caches = [(k_cache.clone(), v_cache.clone())]
        runner = device_plat.make_runner()
        runner.prepare(model, spec_caches, config)
        speculative = execute([(i, contexts[i], tokens[i]) for i in range(3)])
        plain_caches = [(k_cache.clone(), v_cache.clone())]
        runner = device_plat.make_runner()
        runner.prepare(model, plain_caches, config)
        plain = torch.empty_like(speculative)
        starts = [sum(runs[:i]) for i in range(3)]
        for j in range(max(runs)):
            live = [i for i in range(3) if j < runs[i]]
            hidden = execute([(i, contexts[i] + j, [tokens[i][j]]) for i in live])
            for row, i in enumerate(live):
                plain[starts[i] + j] = hidden[row]
        what = "paged_attention and write_kv_cache through the runner on a speculative step (decode rows of 4, 1, 3)"
        self._assert_close(speculative, plain, dtype_name, f"{what}: hidden states vs one token a step")
        for name, got, want in zip("KV", spec_caches[0], plain_caches[0], strict=True):
            self._assert_close(got, want, dtype_name, f"{what}: {name} cache vs one token a step")

    def test_communicator_two_processes(self, device_plat) -> None:
        """The platform's communicator sums and gathers across two processes."""
        from plugins.distributed import check_communicator

        if device_plat.device_type != "cpu" and device_plat.device_info().get("count", 0) < 2:
            pytest.skip(f"{device_plat.name}: the communicator check needs two devices")
        check_communicator(type(device_plat))

    def test_greedy_generation_matches_reference(self, device_plat, tmp_path) -> None:
        core = pytest.importorskip("core", reason="install `core` to run the end-to-end conformance check")
        import torch
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(tiny_model_config()).save_pretrained(tmp_path)
        prompts = [[1, 5, 9, 33, 2], list(range(3, 40)), [7]]
        params = core.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

        def run(device: Any) -> list[list[int]]:
            llm = core.LLM(model=str(tmp_path), device=device, dtype="float32", skip_tokenizer_init=True, seed=0)
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
            llm.shutdown()
            return [o.outputs[0].token_ids for o in outs]

        difference = first_difference(device_plat.name, run(device_plat), run(ReferencePlatform()))
        assert difference is None, difference


class _TinyAttentionModel:
    """Embedding -> write K/V -> paged attention -> projection (-> logits): enough to test a runner."""

    def __init__(self, kernels: Any, dtype_name: str, device: Any, gen: Any) -> None:
        import torch

        dtype = getattr(torch, dtype_name)
        self.kernels = kernels
        self.embed = (torch.randn(100, 3 * 2 * 32, generator=gen) * 0.5).to(device=device, dtype=dtype)
        self.proj = kernels.prepare_linear(
            (torch.randn(16, 2 * 32, generator=gen) * 0.2).to(device=device, dtype=dtype), None
        )
        self.head = kernels.prepare_linear(
            (torch.randn(100, 16, generator=gen) * 0.2).to(device=device, dtype=dtype), None
        )

    def __call__(self, input_ids, positions, kv_caches, meta):
        qkv = self.embed[input_ids].view(-1, 3, 2, 32)
        q, k, v = qkv[:, 0].contiguous(), qkv[:, 1].contiguous(), qkv[:, 2].contiguous()
        k_cache, v_cache = kv_caches[0]
        self.kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = self.kernels.paged_attention(q, k_cache, v_cache, meta, 32**-0.5)
        return self.kernels.linear(out.flatten(1), self.proj)

    def compute_logits(self, hidden):
        """float32 logits over a vocabulary of 100 (what a runner's ``compute_logits`` calls)."""
        return self.kernels.linear(hidden, self.head).float()
