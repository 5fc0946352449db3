"""The conformance kit: every check a backend must pass, as one pytest class.

A backend's test suite subclasses :class:`PlatformConformance` and sets ``platform``::

    from plugins.testing import PlatformConformance
    from my_plugin import MyPlatform

    class TestMyPlatform(PlatformConformance):
        platform = MyPlatform

and inherits every check: identity, API version and availability contract, the
``register_platform`` hook of the installed entry point, env-config parsing of good and
bad values, each kernel against the torch reference on fresh random inputs at
several shapes and each supported dtype, memory profiler sanity, runner padding equal
to eager, and end-to-end greedy generation on a tiny random model equal to the
reference platform's tokens (when ``core`` is installed). Checks that need the device
skip, with the platform's reason, where it is unavailable.

What backend and engine tests share besides the kit (the reference platform, a test
engine config, the tiny model) is in :mod:`plugins.reference`.

This module is also registered as a pytest plugin (entry point ``pytest11``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
from pathlib import Path
from typing import Any, ClassVar

import pluggy
import pytest
from plugins import hookspecs
from plugins.env import EnvConfigError, EnvVar
from plugins.hookspecs import ENTRY_POINT_GROUP
from plugins.platform import PLATFORM_API_VERSION, Platform
from plugins.provenance import TestedCopy, tested_copy
from plugins.reference import ReferencePlatform, engine_config, tiny_model_config
from plugins.testing_kv import KvCacheDtypeConformance

#: absolute/relative tolerance per dtype for kernel outputs compared in float32
TOLERANCES = {"float32": (2e-4, 2e-4), "float16": (3e-3, 3e-3), "bfloat16": (3e-2, 3e-2)}


def _hook_results(module: Any) -> list[Any]:
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    manager.register(module)
    return manager.hook.register_platform()


def _top_package(module_name: str) -> str:
    return module_name.split(".")[0]


def _bad_text(var: EnvVar) -> str | None:
    """A value the variable must reject, or None if any text is acceptable."""
    if var.choices is not None:
        return "definitely-not-a-choice"
    if var.type in (int, float, bool):
        return "not-a-number"
    return None


@functools.cache
def _copy_of(platform_class: type, root: Path) -> TestedCopy:
    return tested_copy(platform_class, root)


def _platform_class(item: pytest.Item) -> type | None:
    cls = getattr(item, "cls", None)
    if cls is None or not issubclass(cls, PlatformConformance) or cls.platform is None:
        return None
    return cls.platform if isinstance(cls.platform, type) else type(cls.platform)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before the checks run, name the file each conformance class tests and how it is installed."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    classes = dict.fromkeys(c for c in map(_platform_class, session.items) if c is not None)
    for platform_class in classes if reporter is not None else ():
        reporter.write_line(f"conformance kit: {_copy_of(platform_class, session.config.rootpath).describe()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A failed check of the kit names the tested copy in its report."""
    outcome = yield
    report = outcome.get_result()
    platform_class = _platform_class(item)
    if report.failed and platform_class is not None:
        report.sections.append(("conformance kit", _copy_of(platform_class, item.config.rootpath).describe()))


def _first_difference(name: str, device: list[list[int]], reference: list[list[int]]) -> str | None:
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


class PlatformConformance(KvCacheDtypeConformance):
    """Inherit this in a backend's tests and set :attr:`platform` to its Platform class."""

    platform: ClassVar[type[Platform] | Platform | None] = None

    # -- helpers -------------------------------------------------------------------------
    @classmethod
    def pytest_generate_tests(cls, metafunc: pytest.Metafunc) -> None:
        if "dtype_name" in metafunc.fixturenames:
            dtypes = cls._instance().supported_dtypes if cls.platform is not None else ("float32",)
            metafunc.parametrize("dtype_name", list(dtypes))
        if "kv_cache_dtype" in metafunc.fixturenames:
            kv_dtypes = cls._instance().supported_kv_cache_dtypes if cls.platform is not None else ()
            metafunc.parametrize("kv_cache_dtype", list(kv_dtypes) or [None])

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

    def _heads(
        self,
        num_tokens: int,
        heads: tuple[int, ...],
        head_size: int,
        dtype_name: str,
        device: Any,
        gen: Any,
        fused: bool,
    ) -> tuple[Any, ...]:
        """Random ``[T, H, D]`` inputs for each ``H`` in ``heads``: separate contiguous tensors, or
        (``fused``) head views into one ``[T, sum(H) * D]`` projection output, as a model's fused qkv
        projection produces them (token stride ``sum(H) * D``, not contiguous)."""
        if not fused:
            return tuple(self._rand((num_tokens, h, head_size), dtype_name, device, gen) for h in heads)

        def head_views(fused_out: Any) -> tuple[Any, ...]:
            parts = fused_out.split([h * head_size for h in heads], dim=-1)
            return tuple(part.view(num_tokens, h, head_size) for part, h in zip(parts, heads, strict=True))

        # the layout is checked on the host: a device without strides (XLA) calls every tensor contiguous
        fused_out = self._rand((num_tokens, sum(heads) * head_size), dtype_name, "cpu", gen)
        assert not any(v.is_contiguous() for v in head_views(fused_out)), "fused head views must not be contiguous"
        return head_views(fused_out.to(device))

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

    def test_api_version(self, plat: Platform) -> None:
        wanted = plat.api_version
        assert wanted is None or wanted == PLATFORM_API_VERSION, (
            f"{type(plat).__name__}.api_version is {wanted}, but this SDK provides PLATFORM_API_VERSION "
            f"{PLATFORM_API_VERSION}: port the platform to version {PLATFORM_API_VERSION} (plugins/README.md)"
        )

    def test_entry_point_hook(self, plat: Platform) -> None:
        """The installed distribution's ``core.platforms`` entry point returns this platform."""
        top = _top_package(type(plat).__module__)
        if top == "plugins":
            pytest.skip("a platform of the SDK itself has no entry point")
        points = [
            ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if _top_package(ep.module) == top
        ]
        if not points:
            dists = importlib.metadata.packages_distributions().get(top)
            assert not dists, (
                f"distribution {dists} provides {top!r} but registers no {ENTRY_POINT_GROUP!r} entry point"
            )
            pytest.skip(f"{top!r} is not installed as a distribution: no entry point to check")
        returned = [result for ep in points for result in _hook_results(ep.load())]
        for result in returned:
            cls = result if isinstance(result, type) else type(result)
            assert issubclass(cls, Platform), f"register_platform() returned {result!r}, not a plugins.Platform"
        assert any(isinstance(plat, r if isinstance(r, type) else type(r)) for r in returned), (
            f"the entry points {[ep.value for ep in points]} of {ENTRY_POINT_GROUP!r} return {returned}, "
            f"not {type(plat).__name__}"
        )

    def test_tested_copy_is_the_source(self, plat: Platform, request: pytest.FixtureRequest) -> None:
        """The imported copy of the package is the source tree it was installed from / the run's root."""
        copy = _copy_of(type(plat), request.config.rootpath)
        assert not copy.stale, (
            f"the kit imports {copy.module_file}, not the source you edit: {copy.source} differs in "
            f"{', '.join(copy.stale)}. Reinstall it, or install it editable (pip install -e), then rerun"
        )

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

    @pytest.mark.parametrize(
        "num_tokens,q_heads,kv_heads,head_size,fused",
        [(1, 4, 4, 64, False), (9, 9, 3, 64, False), (17, 8, 2, 128, False), (9, 9, 3, 64, True), (3, 4, 2, 128, True)],
    )
    def test_rotary_embedding(
        self, device_plat, ref, gen, dtype_name, num_tokens, q_heads, kv_heads, head_size, fused
    ) -> None:
        import torch

        dev = device_plat.torch_device()
        inv = 1.0 / (10000 ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        freqs = torch.outer(torch.arange(256, dtype=torch.float32), inv)
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dev)
        positions = torch.randint(0, 256, (num_tokens,), generator=gen).to(dev)
        q, k, v = self._heads(num_tokens, (q_heads, kv_heads, kv_heads), head_size, dtype_name, dev, gen, fused)
        ref_q, ref_k = ref.rotary_embedding(positions, q.clone(), k.clone(), cache)
        v_before = v.clone()
        got_q, got_k = device_plat.kernels.rotary_embedding(positions, q, k, cache)  # may rotate in place
        layout = "fused qkv views" if fused else "contiguous"
        self._assert_close(got_q, ref_q, dtype_name, f"rotary_embedding q ({layout})")
        self._assert_close(got_k, ref_k, dtype_name, f"rotary_embedding k ({layout})")
        self._assert_close(v, v_before, dtype_name, f"rotary_embedding must not write outside q and k ({layout})")

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

    @pytest.mark.parametrize("block_size,fused", [(16, False), (32, False), (16, True)])
    def test_write_kv_cache(self, device_plat, ref, gen, dtype_name, block_size, fused) -> None:
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, [5, 1, 19], [5, 40, 19], 2, 64, block_size)
        dev = device_plat.torch_device()
        _, k, v = self._heads(meta.num_tokens, (4, 2, 2), 64, dtype_name, dev, gen, fused)
        meta.slot_mapping[1] = -1  # padding token: must not be written
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        ref.write_kv_cache(k.clone(), v.clone(), ref_k, ref_v, meta.slot_mapping)
        device_plat.kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        layout = "fused qkv views" if fused else "contiguous"
        self._assert_close(k_cache, ref_k, dtype_name, f"write_kv_cache k ({layout})")
        self._assert_close(v_cache, ref_v, dtype_name, f"write_kv_cache v ({layout})")

    @pytest.mark.parametrize(
        "query_lens,seq_lens,q_heads,kv_heads,head_size,block_size,fused",
        [
            ([1], [1], 4, 4, 64, 16, False),  # first decode token
            ([1, 1, 1], [17, 3, 64], 9, 3, 64, 16, False),  # decode batch, GQA
            ([13], [13], 8, 2, 128, 16, False),  # prefill
            ([7, 1, 30, 1], [7, 100, 45, 33], 6, 2, 64, 32, False),  # mixed: prefill, decode, chunked prefill
            ([1, 1, 1], [17, 3, 64], 9, 3, 64, 16, True),  # decode batch, q a view of the fused qkv
            ([7, 1, 30, 1], [7, 100, 45, 33], 6, 2, 64, 32, True),  # mixed, q a view of the fused qkv
        ],
    )
    def test_paged_attention(
        self, device_plat, ref, gen, dtype_name, query_lens, seq_lens, q_heads, kv_heads, head_size, block_size, fused
    ) -> None:
        meta, k_cache, v_cache = self._kv_case(
            device_plat, gen, dtype_name, query_lens, seq_lens, kv_heads, head_size, block_size
        )
        dev = device_plat.torch_device()
        q = self._heads(meta.num_tokens, (q_heads, kv_heads, kv_heads), head_size, dtype_name, dev, gen, fused)[0]
        scale = head_size**-0.5
        got = device_plat.kernels.paged_attention(q, k_cache, v_cache, meta, scale)
        expected = ref.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, scale)
        layout = "fused qkv views" if fused else "contiguous"
        self._assert_close(got, expected, dtype_name, f"paged_attention ({layout})")

    @pytest.mark.parametrize("window", [1, 5, 40])
    def test_paged_attention_sliding_window(self, device_plat, ref, gen, dtype_name, window) -> None:
        """A local layer's window (Gemma 3): each query sees only its last ``window`` positions."""
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, [7, 1, 30, 1], [7, 100, 45, 33], 2, 64, 16)
        q = self._heads(meta.num_tokens, (4, 2, 2), 64, dtype_name, device_plat.torch_device(), gen, False)[0]
        got = device_plat.kernels.paged_attention(q, k_cache, v_cache, meta, 0.125, sliding_window=window)
        expected = ref.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, 0.125, sliding_window=window)
        self._assert_close(got, expected, dtype_name, f"paged_attention (sliding window {window})")

    # -- memory profiler and runner ------------------------------------------------------------
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

        difference = _first_difference(device_plat.name, run(device_plat), run(ReferencePlatform()))
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
