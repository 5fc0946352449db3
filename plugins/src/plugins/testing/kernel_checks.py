"""The kit's kernel checks: each op's signature is the SDK's, and its results the reference's."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from plugins.platform import Platform
from plugins.testing.base import ConformanceBase


def _bare(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without annotations: names, kinds and defaults are the contract."""
    empty = inspect.Parameter.empty
    params = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return signature.replace(parameters=params, return_annotation=empty)


def signature_drift(kernels: Any) -> list[str]:
    """Each op of ``kernels`` whose parameters (names, order, kinds, defaults) differ from the
    SDK's :class:`plugins.kernels.Kernels`, as ``"Own.op(...) but Kernels.op(...)"``."""
    from plugins.kernels import Kernels

    drift = []
    for name, reference in vars(Kernels).items():
        if name.startswith("_") or not inspect.isfunction(reference):
            continue
        own = getattr(type(kernels), name)
        want, got = _bare(inspect.signature(reference)), _bare(inspect.signature(own))
        if got != want:
            drift.append(f"{type(kernels).__name__}.{name}{got} but Kernels.{name}{want}")
    return drift


class KernelChecks(ConformanceBase):
    """Every op the model layers call: signature and results against the torch reference."""

    def test_kernel_signatures(self, plat: Platform) -> None:
        """Each op takes the SDK's arguments (core's layers pass all of them, by keyword too)."""
        if plat.is_available():
            kernels = plat.kernels
        else:
            try:
                kernels = plat.make_kernels()
            except Exception as exc:  # a kernel set that needs the absent device to be built
                pytest.skip(f"{plat.name} unavailable ({plat.unavailable_reason()}); its kernels need it: {exc}")
        drift = signature_drift(kernels)
        assert not drift, "kernel signatures differ from the SDK's plugins.kernels.Kernels:\n" + "\n".join(drift)

    @pytest.mark.parametrize("num_tokens,hidden", [(1, 64), (7, 576), (33, 1024)])
    def test_rms_norm(self, device_plat, ref, gen, dtype_name, num_tokens, hidden) -> None:
        dev = device_plat.torch_device()
        x = self._rand((num_tokens, hidden), dtype_name, dev, gen)
        res = self._rand((num_tokens, hidden), dtype_name, dev, gen)
        w = self._rand((hidden,), dtype_name, dev, gen, 0.5)
        what = f"random N(0,1) rows [{num_tokens}, {hidden}]"
        with self._named(f"rms_norm on {what}", dtype_name):
            got = device_plat.kernels.rms_norm(x, w, 1e-5)
        self._assert_close(got, ref.rms_norm(x, w, 1e-5), dtype_name, f"rms_norm on {what}")
        with self._named(f"fused_add_rms_norm on {what}", dtype_name):
            out, new_res = device_plat.kernels.fused_add_rms_norm(x.clone(), res.clone(), w, 1e-6)
        ref_out, ref_res = ref.fused_add_rms_norm(x, res, w, 1e-6)
        self._assert_close(out, ref_out, dtype_name, f"fused_add_rms_norm output on {what}")
        self._assert_close(new_res, ref_res, dtype_name, f"fused_add_rms_norm residual on {what}")

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
        layout = "random positions, fused qkv views" if fused else "random positions, contiguous"
        with self._named(f"rotary_embedding on {layout}", dtype_name):
            got_q, got_k = device_plat.kernels.rotary_embedding(positions, q, k, cache)  # may rotate in place
        self._assert_close(got_q, ref_q, dtype_name, f"rotary_embedding q on {layout}")
        self._assert_close(got_k, ref_k, dtype_name, f"rotary_embedding k on {layout}")
        self._assert_close(v, v_before, dtype_name, f"rotary_embedding on {layout} must not write outside q and k")

    @pytest.mark.parametrize("num_tokens,inter", [(1, 64), (5, 1536), (32, 256)])
    def test_silu_and_mul(self, device_plat, ref, gen, dtype_name, num_tokens, inter) -> None:
        x = self._rand((num_tokens, 2 * inter), dtype_name, device_plat.torch_device(), gen)
        what = f"silu_and_mul on random N(0,1) rows [{num_tokens}, {2 * inter}]"
        with self._named(what, dtype_name):
            got = device_plat.kernels.silu_and_mul(x)
        self._assert_close(got, ref.silu_and_mul(x), dtype_name, what)

    @pytest.mark.parametrize("num_rows,vocab,rows", [(1, 100, [0]), (5, 1000, [4, 0, 2]), (3, 4096, [1, 2])])
    def test_apply_token_bitmask(self, device_plat, gen, num_rows, vocab, rows) -> None:
        """Structured outputs' mask: forbidden logits -inf, allowed ones and other rows untouched (exact)."""
        import torch

        dev = device_plat.torch_device()
        logits = torch.randn((num_rows, vocab), generator=gen).to(dev)
        words = (vocab + 31) // 32
        bitmask = torch.randint(-(2**31), 2**31 - 1, (len(rows), words), generator=gen, dtype=torch.int64)
        bitmask = bitmask.to(torch.int32)
        expected = logits.cpu().clone()
        for j, row in enumerate(rows):  # bit t % 32 of word t // 32, one token at a time
            for t in range(vocab):
                if not (int(bitmask[j, t // 32]) >> (t % 32)) & 1:
                    expected[row, t] = float("-inf")
        got, what = logits.clone(), f"apply_token_bitmask on random words, rows {rows} of {num_rows}"
        with self._named(what, "float32"):
            device_plat.kernels.apply_token_bitmask(got, bitmask, rows)
        wrong = (got.cpu() != expected).nonzero().tolist()
        assert not wrong, (
            f"{what}: {len(wrong)} logits differ from the bit-by-bit mask, first [row, token]: {wrong[:3]}"
        )

    @pytest.mark.parametrize("num_tokens,in_features,out_features", [(1, 64, 96), (6, 576, 192), (40, 128, 256)])
    def test_linear(self, device_plat, ref, gen, dtype_name, num_tokens, in_features, out_features) -> None:
        dev = device_plat.torch_device()
        x = self._rand((num_tokens, in_features), dtype_name, dev, gen)
        w = self._rand((out_features, in_features), dtype_name, dev, gen, in_features**-0.5)
        b = self._rand((out_features,), dtype_name, dev, gen)
        what = f"linear on random N(0,1) x [{num_tokens}, {in_features}], weight [{out_features}, {in_features}]"
        with self._named(what, dtype_name):
            got = device_plat.kernels.linear(x, device_plat.kernels.prepare_linear(w, None), b)
        expected = ref.linear(x.float(), w.float(), b.float())
        self._assert_close(got, expected, dtype_name, what)

    @pytest.mark.parametrize("approximate", ["none", "tanh"])
    def test_linear_gelu(self, device_plat, ref, gen, dtype_name, approximate) -> None:
        dev = device_plat.torch_device()
        x = self._rand((7, 128), dtype_name, dev, gen)
        w = self._rand((256, 128), dtype_name, dev, gen, 128**-0.5)
        b = self._rand((256,), dtype_name, dev, gen)
        what = f"linear_gelu (approximate={approximate!r}) on random N(0,1) x [7, 128], weight [256, 128]"
        with self._named(what, dtype_name):
            got = device_plat.kernels.linear_gelu(x, device_plat.kernels.prepare_linear(w, None), b, approximate)
        expected = ref.linear_gelu(x.float(), w.float(), b.float(), approximate)
        self._assert_close(got, expected, dtype_name, what)

    @pytest.mark.parametrize("block_size,fused", [(16, False), (32, False), (16, True)])
    def test_write_kv_cache(self, device_plat, ref, gen, dtype_name, block_size, fused) -> None:
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, [5, 1, 19], [5, 40, 19], 2, 64, block_size)
        dev = device_plat.torch_device()
        _, k, v = self._heads(meta.num_tokens, (4, 2, 2), 64, dtype_name, dev, gen, fused)
        meta.slot_mapping[1] = -1  # padding token: must not be written
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        ref.write_kv_cache(k.clone(), v.clone(), ref_k, ref_v, meta.slot_mapping)
        layout = "scattered blocks, fused qkv views" if fused else "scattered blocks, contiguous"
        with self._named(f"write_kv_cache on {layout}", dtype_name):
            device_plat.kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        self._assert_close(k_cache, ref_k, dtype_name, f"write_kv_cache k on {layout}")
        self._assert_close(v_cache, ref_v, dtype_name, f"write_kv_cache v on {layout}")

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
        what = f"paged_attention on query_lens {query_lens}, seq_lens {seq_lens}" + (", fused qkv views" * fused)
        with self._named(what, dtype_name):
            got = device_plat.kernels.paged_attention(q, k_cache, v_cache, meta, scale)
        expected = ref.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, scale)
        self._assert_close(got, expected, dtype_name, what)

    @pytest.mark.parametrize("window", [1, 5, 40])
    def test_paged_attention_sliding_window(self, device_plat, ref, gen, dtype_name, window) -> None:
        """A local layer's window (Gemma 3): each query sees only its last ``window`` positions."""
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, [7, 1, 30, 1], [7, 100, 45, 33], 2, 64, 16)
        q = self._heads(meta.num_tokens, (4, 2, 2), 64, dtype_name, device_plat.torch_device(), gen, False)[0]
        what = f"paged_attention on a mixed batch with sliding window {window}"
        with self._named(what, dtype_name):
            got = device_plat.kernels.paged_attention(q, k_cache, v_cache, meta, 0.125, sliding_window=window)
        expected = ref.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, 0.125, sliding_window=window)
        self._assert_close(got, expected, dtype_name, what)
