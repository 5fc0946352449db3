"""What every group of the kit's checks shares: the platform under test, its fixtures and inputs."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from plugins.platform import Platform

#: ``(atol, rtol)`` per dtype for kernel outputs compared in float32 with a reference that
#: computes in float32 from the same (rounded) inputs: a few units in the last place of the
#: dtype (float16 keeps 11 significant bits, bfloat16 8). Checks whose outputs scale with their
#: inputs multiply ``atol`` by that scale (:meth:`ConformanceBase._assert_close`).
TOLERANCES = {"float32": (2e-4, 2e-4), "float16": (3e-3, 3e-3), "bfloat16": (3e-2, 3e-2)}


class ConformanceBase:
    """The platform under test (:attr:`platform`), its fixtures and the kit's random inputs."""

    platform: ClassVar[type[Platform] | Platform | None] = None

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

    @pytest.fixture
    def ref(self) -> Any:
        """The SDK's reference kernels."""
        from plugins.kernels import Kernels

        return Kernels()

    @pytest.fixture
    def gen(self) -> Any:
        import torch

        return torch.Generator().manual_seed(1234)

    @staticmethod
    def _assert_close(
        actual: Any,
        expected: Any,
        dtype_name: str,
        what: str,
        tolerances: dict[str, tuple[float, float]] = TOLERANCES,
        scale: float = 1.0,
    ) -> None:
        """``actual`` within ``tolerances[dtype_name]`` of ``expected`` (``atol`` times ``scale``,
        the magnitude of outputs that scale with the inputs); ``what`` names the kernel and inputs."""
        import torch

        atol, rtol = tolerances[dtype_name]
        torch.testing.assert_close(
            actual.float().cpu(),
            expected.float().cpu(),
            atol=atol * scale,
            rtol=rtol,
            msg=lambda m: f"{what} ({dtype_name}): {m}",
        )

    @staticmethod
    @contextlib.contextmanager
    def _named(what: str, dtype_name: str) -> Iterator[None]:
        """An error a kernel raises inside the block fails the check naming the kernel and inputs."""
        try:
            yield
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(f"{what} ({dtype_name}) raised {type(exc).__name__}: {exc}") from exc

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

    def _kv_case(self, plat, gen, dtype_name, query_lens, seq_lens, kv_heads, head_size, block_size):
        """Attention metadata over scattered blocks and random K/V caches for those sequences."""
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
