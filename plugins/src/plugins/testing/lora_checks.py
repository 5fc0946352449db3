"""The LoRA hook: ``Kernels.lora_shrink`` + ``Kernels.lora_expand`` over a mixed batch, against a float64 row loop."""

from __future__ import annotations

import pytest
from plugins.testing.base import ConformanceBase


class LoRAChecks(ConformanceBase):
    """A fused projection's adapter deltas: rows of several slots and base rows (-1), padded rows after
    the mapped ones, each part expanded into its own output columns."""

    @pytest.mark.parametrize(
        "row_slots,num_padded,in_features,parts,rank",
        [([3], 0, 64, (32,), 1),  # one token of the last slot, rank 1
         ([0], 0, 64, (32,), 8), ([1, -1, 0, 1, 1, -1, 2], 1, 128, (64, 32, 32), 16),
         ([-1] * 5 + [3] * 28, 3, 64, (96, 96), 8)],
    )  # fmt: skip
    def test_lora_shrink_expand(self, device_plat, gen, dtype_name, row_slots, num_padded, in_features, parts,
                                rank) -> None:  # fmt: skip
        import torch
        from plugins.lora import LoRAMapping

        dev = device_plat.torch_device()
        num_slots, num_rows = 4, len(row_slots) + num_padded
        x = self._rand((num_rows, in_features), dtype_name, dev, gen)
        lora_a = self._rand((num_slots, len(parts) * rank, in_features), dtype_name, dev, gen, in_features**-0.5)
        lora_b = [self._rand((num_slots, n, rank), dtype_name, dev, gen, rank**-0.5) for n in parts]
        y = self._rand((num_rows, sum(parts)), dtype_name, dev, gen)
        mapping = LoRAMapping.build(row_slots, dev)
        kernels = device_plat.kernels
        what = f"a batch of slots {row_slots} + {num_padded} padded rows, parts {parts} of rank {rank}"
        with self._named(f"lora_shrink/lora_expand on {what}", dtype_name):
            h = kernels.lora_shrink(x, lora_a, mapping)
            got = y.clone()
            for i, (b, offset) in enumerate(zip(lora_b, [sum(parts[:i]) for i in range(len(parts))], strict=True)):
                kernels.lora_expand(got, h[:, i * rank : (i + 1) * rank], b, mapping, offset)
        expected_h = torch.zeros(num_rows, len(parts) * rank, dtype=torch.float64)
        expected = y.double().cpu()
        for t, slot in enumerate(row_slots):
            if slot >= 0:
                expected_h[t] = lora_a[slot].double().cpu() @ x[t].double().cpu()
                delta = [
                    b[slot].double().cpu() @ expected_h[t, i * rank : (i + 1) * rank] for i, b in enumerate(lora_b)
                ]
                expected[t] += torch.cat(delta)
        assert h.shape == expected_h.shape and h.dtype == torch.float32, f"lora_shrink gave {h.dtype} {tuple(h.shape)}"
        assert got.dtype == y.dtype, f"lora_expand changed the output's dtype to {got.dtype}"
        self._assert_close(h, expected_h, dtype_name, f"lora_shrink on {what}")
        self._assert_close(got, expected, dtype_name, f"lora_expand on {what}")
