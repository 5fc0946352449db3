"""The conformance kit: every check a backend must pass, as one pytest class.

A backend's test suite subclasses :class:`PlatformConformance` and sets ``platform``::

    from plugins.testing import PlatformConformance
    from my_plugin import MyPlatform

    class TestMyPlatform(PlatformConformance):
        platform = MyPlatform

and inherits every check: identity and availability contract, env-config parsing of
good and bad values, each kernel against the torch reference on fresh random inputs at
several shapes and each supported dtype, memory profiler sanity, runner padding equal
to eager, and end-to-end greedy generation on a tiny random model equal to the
reference platform's tokens (when ``core`` is installed). Checks that need the device
skip, with the platform's reason, where it is unavailable.

This module is also registered as a pytest plugin (entry point ``pytest11``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import pytest
from plugins.env import EnvConfigError, EnvVar
from plugins.platform import Platform

#: absolute/relative tolerance per dtype for kernel outputs compared in float32
TOLERANCES = {"float32": (2e-4, 2e-4), "float16": (3e-3, 3e-3), "bfloat16": (3e-2, 3e-2)}


def _bad_text(var: EnvVar) -> str | None:
    """A value the variable must reject, or None if any text is acceptable."""
    if var.choices is not None:
        return "definitely-not-a-choice"
    if var.type in (int, float, bool):
        return "not-a-number"
    return None


class PlatformConformance:
    """Inherit this in a backend's tests and set :attr:`platform` to its Platform class."""

    platform: ClassVar[type[Platform] | Platform | None] = None

    # -- helpers -------------------------------------------------------------------------
    @classmethod
    def pytest_generate_tests(cls, metafunc: pytest.Metafunc) -> None:
        if "dtype_name" in metafunc.fixturenames:
            dtypes = cls._instance().supported_dtypes if cls.platform is not None else ("float32",)
            metafunc.parametrize("dtype_name", list(dtypes))

    @classmethod
    def _instance(cls) -> Platform:
        if cls.platform is None:
            raise TypeError(f"{cls.__name__} must set `platform` to a plugins.Platform subclass")
        if "_platform_instance" not in cls.__dict__:
            cls._platform_instance = cls.platform() if isinstance(cls.platform, type) else cls.platform
        return cls._platform_instance

    @pytest.fixture
    def plat(self) -> Platform:
        return self._instance()

    @pytest.fixture
    def device_plat(self, plat: Platform) -> Platform:
        """The platform, skipping the test (with the reason) where it is unavailable."""
        if not plat.is_available():
            pytest.skip(f"{plat.name} unavailable: {plat.unavailable_reason()}")
        return plat

    @staticmethod
    def _assert_close(actual: Any, expected: Any, dtype_name: str, what: str) -> None:
        import torch

        atol, rtol = TOLERANCES[dtype_name]
        torch.testing.assert_close(
            actual.float().cpu(),
            expected.float().cpu(),
            atol=atol,
            rtol=rtol,
            msg=lambda m: f"{what} ({dtype_name}): {m}",
        )

    @staticmethod
    def _rand(shape: tuple[int, ...], dtype_name: str, device: Any, generator: Any, scale: float = 1.0) -> Any:
        import torch

        x = torch.randn(shape, generator=generator, dtype=torch.float32) * scale
        return x.to(device=device, dtype=getattr(torch, dtype_name))

    @pytest.fixture
    def gen(self) -> Any:
        import torch

        return torch.Generator().manual_seed(1234)

    # -- identity, availability, env ---------------------------------------------------------
    def test_identity(self, plat: Platform) -> None:
        assert isinstance(plat, Platform)
        assert isinstance(plat.name, str) and plat.name.isidentifier(), f"name {plat.name!r} must be an identifier"
        assert isinstance(plat.device_type, str) and plat.device_type, "device_type must be a torch device type"
        assert isinstance(plat.priority, int)
        assert plat.supported_dtypes, "supported_dtypes must not be empty"
        assert set(plat.supported_dtypes) <= {"float32", "bfloat16", "float16"}

    def test_availability_contract(self, plat: Platform) -> None:
        available = plat.is_available()
        assert isinstance(available, bool), "is_available() must return a bool"
        reason = plat.unavailable_reason()
        if available:
            assert reason is None, "an available platform has no unavailable_reason()"
            assert isinstance(plat.device_info(), dict)
        else:
            assert isinstance(reason, str) and reason.strip(), "an unavailable platform must say why"

    def test_env_defaults(self, plat: Platform) -> None:
        names = [var.name for var in plat.env_vars]
        assert len(names) == len(set(names)), f"duplicate env variables: {names}"
        values = plat.read_env({})
        for var in plat.env_vars:
            assert values[var.name] == var.default
            assert var.help, f"{var.env_name} needs a help text"

    def test_env_good_values_and_fallback(self, plat: Platform) -> None:
        for var in plat.env_vars:
            if var.default is None:
                continue
            text = ",".join(map(str, var.default)) if isinstance(var.default, tuple) else str(var.default)
            assert plat.read_env({var.env_name: text})[var.name] == var.default
            assert plat.read_env({var.fallback_name: text})[var.name] == var.default

    def test_env_bad_values_name_the_variable(self, plat: Platform) -> None:
        for var in plat.env_vars:
            bad = _bad_text(var)
            if bad is None:
                continue
            with pytest.raises(EnvConfigError, match=var.env_name):
                plat.read_env({var.env_name: bad})

    # -- kernels against the reference -------------------------------------------------------
    @pytest.fixture
    def ref(self) -> Any:
        from plugins.kernels import Kernels

        return Kernels()

    @pytest.mark.parametrize("num_tokens,hidden", [(1, 64), (7, 576), (33, 1024)])
    def test_rms_norm(self, device_plat, ref, gen, dtype_name, num_tokens, hidden) -> None:
        dev = device_plat.torch_device()
        x = self._rand((num_tokens, hidden), dtype_name, dev, gen)
        res = self._rand((num_tokens, hidden), dtype_name, dev, gen)
        w = self._rand((hidden,), dtype_name, dev, gen, 0.5)
        self._assert_close(device_plat.kernels.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), dtype_name, "rms_norm")
        out, new_res = device_plat.kernels.fused_add_rms_norm(x.clone(), res.clone(), w, 1e-6)
        ref_out, ref_res = ref.fused_add_rms_norm(x, res, w, 1e-6)
        self._assert_close(out, ref_out, dtype_name, "fused_add_rms_norm output")
        self._assert_close(new_res, ref_res, dtype_name, "fused_add_rms_norm residual")

    @pytest.mark.parametrize("num_tokens,q_heads,kv_heads,head_size", [(1, 4, 4, 64), (9, 9, 3, 64), (17, 8, 2, 128)])
    def test_rotary_embedding(
        self, device_plat, ref, gen, dtype_name, num_tokens, q_heads, kv_heads, head_size
    ) -> None:
        import torch

        dev = device_plat.torch_device()
        inv = 1.0 / (10000 ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        freqs = torch.outer(torch.arange(256, dtype=torch.float32), inv)
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dev)
        positions = torch.randint(0, 256, (num_tokens,), generator=gen).to(dev)
        q = self._rand((num_tokens, q_heads, head_size), dtype_name, dev, gen)
        k = self._rand((num_tokens, kv_heads, head_size), dtype_name, dev, gen)
        got_q, got_k = device_plat.kernels.rotary_embedding(positions, q.clone(), k.clone(), cache)
        ref_q, ref_k = ref.rotary_embedding(positions, q, k, cache)
        self._assert_close(got_q, ref_q, dtype_name, "rotary_embedding q")
        self._assert_close(got_k, ref_k, dtype_name, "rotary_embedding k")

    @pytest.mark.parametrize("num_tokens,inter", [(1, 64), (5, 1536), (32, 256)])
    def test_silu_and_mul(self, device_plat, ref, gen, dtype_name, num_tokens, inter) -> None:
        x = self._rand((num_tokens, 2 * inter), dtype_name, device_plat.torch_device(), gen)
        self._assert_close(device_plat.kernels.silu_and_mul(x), ref.silu_and_mul(x), dtype_name, "silu_and_mul")

    @pytest.mark.parametrize("num_tokens,in_features,out_features", [(1, 64, 96), (6, 576, 192), (40, 128, 256)])
    def test_linear(self, device_plat, ref, gen, dtype_name, num_tokens, in_features, out_features) -> None:
        dev = device_plat.torch_device()
        x = self._rand((num_tokens, in_features), dtype_name, dev, gen)
        w = self._rand((out_features, in_features), dtype_name, dev, gen, in_features**-0.5)
        b = self._rand((out_features,), dtype_name, dev, gen)
        got = device_plat.kernels.linear(x, device_plat.kernels.prepare_linear(w, None), b)
        expected = ref.linear(x.float(), w.float(), b.float())
        self._assert_close(got, expected, dtype_name, "linear")

    def _kv_case(self, plat, gen, dtype_name, query_lens, seq_lens, kv_heads, head_size, block_size):
        import torch
        from plugins.attention import AttentionMetadata

        dev = plat.torch_device()
        blocks_needed = [math.ceil(s / block_size) for s in seq_lens]
        num_blocks = sum(blocks_needed) + 3
        perm = torch.randperm(num_blocks, generator=gen).tolist()  # scattered, non-contiguous blocks
        tables, start = [], 0
        for n in blocks_needed:
            tables.append(perm[start : start + n])
            start += n
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size, device=dev)
        shape = (num_blocks, block_size, kv_heads, head_size)
        k_cache = self._rand(shape, dtype_name, dev, gen)
        v_cache = self._rand(shape, dtype_name, dev, gen)
        return meta, k_cache, v_cache

    @pytest.mark.parametrize("block_size", [16, 32])
    def test_write_kv_cache(self, device_plat, ref, gen, dtype_name, block_size) -> None:
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, [5, 1, 19], [5, 40, 19], 2, 64, block_size)
        dev = device_plat.torch_device()
        k = self._rand((meta.num_tokens, 2, 64), dtype_name, dev, gen)
        v = self._rand((meta.num_tokens, 2, 64), dtype_name, dev, gen)
        meta.slot_mapping[1] = -1  # padding token: must not be written
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        ref.write_kv_cache(k, v, ref_k, ref_v, meta.slot_mapping)
        device_plat.kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        self._assert_close(k_cache, ref_k, dtype_name, "write_kv_cache k")
        self._assert_close(v_cache, ref_v, dtype_name, "write_kv_cache v")

    @pytest.mark.parametrize(
        "query_lens,seq_lens,q_heads,kv_heads,head_size,block_size",
        [
            ([1], [1], 4, 4, 64, 16),  # first decode token
            ([1, 1, 1], [17, 3, 64], 9, 3, 64, 16),  # decode batch, GQA
            ([13], [13], 8, 2, 128, 16),  # prefill
            ([7, 1, 30, 1], [7, 100, 45, 33], 6, 2, 64, 32),  # mixed: prefill, decode, chunked prefill
        ],
    )
    def test_paged_attention(
        self, device_plat, ref, gen, dtype_name, query_lens, seq_lens, q_heads, kv_heads, head_size, block_size
    ) -> None:
        meta, k_cache, v_cache = self._kv_case(
            device_plat, gen, dtype_name, query_lens, seq_lens, kv_heads, head_size, block_size
        )
        q = self._rand((meta.num_tokens, q_heads, head_size), dtype_name, device_plat.torch_device(), gen)
        scale = head_size**-0.5
        got = device_plat.kernels.paged_attention(q, k_cache, v_cache, meta, scale)
        expected = ref.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, scale)
        self._assert_close(got, expected, dtype_name, "paged_attention")

    # -- memory profiler and runner ------------------------------------------------------------
    def test_memory_profiler(self, device_plat) -> None:
        from plugins.memory import KVCachePlan

        mem = device_plat.memory
        total, free = mem.total_memory(), mem.free_memory()
        assert total > 0 and 0 <= free <= total, f"total={total} free={free}"
        assert mem.measure_peak(lambda: None) >= 0
        assert isinstance(mem.needs_profile_run, bool), "MemoryProfiler.needs_profile_run must be a bool"

        class Config:
            kv_cache_bytes = 64 << 20
            gpu_memory_utilization = 0.5

        plan = mem.plan_kv_cache(Config(), block_bytes=1 << 20, peak_activation_bytes=0)
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
        caches = [(k_cache.clone(), v_cache.clone())]
        eager = Runner(device_plat).execute(model, caches, inputs)
        padded_caches = [(k_cache.clone(), v_cache.clone())]
        padded = device_plat.runner.forward(model, padded_caches, pad_inputs(inputs, 8))[:3]
        self._assert_close(padded, eager, dtype_name, "padded forward vs eager")
        self._assert_close(padded_caches[0][0], caches[0][0], dtype_name, "KV cache after padded forward")

    def test_communicator_two_processes(self, device_plat) -> None:
        """The platform's communicator sums and gathers across two processes."""
        from plugins.distributed import check_communicator

        if device_plat.device_type != "cpu" and device_plat.device_info().get("count", 0) < 2:
            pytest.skip(f"{device_plat.name}: the communicator check needs two devices")
        check_communicator(type(device_plat))

    # -- end to end --------------------------------------------------------------------------
    def test_greedy_generation_matches_reference(self, device_plat, tmp_path) -> None:
        core = pytest.importorskip("core", reason="install `core` to run the end-to-end conformance check")
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
        LlamaForCausalLM(config).save_pretrained(tmp_path)
        prompts = [[1, 5, 9, 33, 2], list(range(3, 40)), [7]]
        params = core.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

        def run(device: Any) -> list[list[int]]:
            llm = core.LLM(model=str(tmp_path), device=device, dtype="float32", skip_tokenizer_init=True, seed=0)
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
            llm.shutdown()
            return [o.outputs[0].token_ids for o in outs]

        assert run(device_plat) == run(_ReferencePlatform())


class _ReferencePlatform(Platform):
    """The SDK's own defaults on the CPU: what every backend is compared with."""

    name = "reference"
    device_type = "cpu"

    def is_available(self) -> bool:
        return True


class _TinyAttentionModel:
    """Embedding -> write K/V -> paged attention -> projection: enough to test a runner."""

    def __init__(self, kernels: Any, dtype_name: str, device: Any, gen: Any) -> None:
        import torch

        dtype = getattr(torch, dtype_name)
        self.kernels = kernels
        self.embed = (torch.randn(100, 3 * 2 * 32, generator=gen) * 0.5).to(device=device, dtype=dtype)
        self.proj = kernels.prepare_linear(
            (torch.randn(16, 2 * 32, generator=gen) * 0.2).to(device=device, dtype=dtype), None
        )

    def __call__(self, input_ids, positions, kv_caches, meta):
        qkv = self.embed[input_ids].view(-1, 3, 2, 32)
        q, k, v = qkv[:, 0].contiguous(), qkv[:, 1].contiguous(), qkv[:, 2].contiguous()
        k_cache, v_cache = kv_caches[0]
        self.kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = self.kernels.paged_attention(q, k_cache, v_cache, meta, 32**-0.5)
        return self.kernels.linear(out.flatten(1), self.proj)
